"""All database work of chronoq behind one ``Store``, its statements grouped by role.

Driver errors become ``StoreUnavailable`` in ``connection`` and nowhere else. Every owner
statement (fire, reap, watermark) carries the partition's fencing token and does nothing
when the stored token is no longer the caller's.
"""

from __future__ import annotations

from chronoq.store.bulk import BulkStatements
from chronoq.store.connection import IDLE_IN_TRANSACTION_TIMEOUT_MS, Listener, _translated
from chronoq.store.history import HistoryStatements
from chronoq.store.operator import OperatorStatements
from chronoq.store.owner import OwnerStatements
from chronoq.store.queue_counts import QueueCountStatements
from chronoq.store.queues import QueueStatements
from chronoq.store.rows import Fence, FireResult, known, parse_task_id
from chronoq.store.task_inserts import COLUMN_SLICE
from chronoq.store.tasks import PAGE_BYTES, ROW_BYTES, TaskStatements

__all__ = [
    "COLUMN_SLICE",
    "IDLE_IN_TRANSACTION_TIMEOUT_MS",
    "PAGE_BYTES",
    "ROW_BYTES",
    "Fence",
    "FireResult",
    "Listener",
    "Store",
    "_translated",
    "known",
    "parse_task_id",
]


class Store(
    TaskStatements,
    OwnerStatements,
    OperatorStatements,
    QueueCountStatements,
    QueueStatements,
    BulkStatements,
    HistoryStatements,
):
    """The task store on one PostgreSQL database (a pool of connections).

    Its roles: ``connection`` (pool, liveness, error translation, notices), ``migrations``,
    ``tasks`` (client and worker statements), ``owner`` (fenced owner statements) and
    ``operator`` (requeue, limits, retention, counts), ``queue_counts`` (the counts the
    owners keep), ``queues`` (pause, resume, per-key limits), ``bulk`` (bulk operations by
    filter), ``history`` (the sweep of finished tasks into their history, its time slices);
    ``rows`` maps what they read.
    """
