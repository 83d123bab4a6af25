"""The store port: what the node asks of a task store, grouped by how each call routes.

A store of several shards sends each call where its routing says: by partition (the owner's
fenced statements and the reads and retention over given partitions: to each partition's
shard), by task id (the id carries its partition: one shard, no fan-out), by placement key
(a submit's partition comes from its routing key), by queue (claims and queue limits: every
shard holding the queue's ready tasks; limits on the queue's home), and admin (listings and
counts over every partition: fan out and merge). The PostgreSQL ``Store`` on one database is
the first implementation (checked below); components take the narrowest
port they use, never the concrete store.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from chronoq.models import (
    AckOutcome,
    HeartbeatOutcome,
    Lease,
    Page,
    QueueCounts,
    Schedule,
    ScheduleSpec,
    SubmitOutcome,
    Task,
    TaskSpec,
    TaskState,
)
from chronoq.queue_settings import QueueSettings, Resumed
from chronoq.queuecounts import KeptCounts
from chronoq.store.history import Retired, SliceUpkeep
from chronoq.store.rows import Accepted, Fence, FireResult
from chronoq.taskfilter import BulkAction, BulkDone, TaskFilter

if TYPE_CHECKING:
    from chronoq.store.schedules import Charge, Materialized

#: A task as the timing wheel holds it: (id, partition, run_at, namespace, queue).
DueSoon = tuple[str, int, datetime, str, str]


class Buckets(Protocol):
    """The time-bucket width the store was made with (seconds)."""

    @property
    def bucket_seconds(self) -> int: ...


class ByPartition(Buckets, Protocol):
    """Statements whose scope is a set of partitions: each goes to the partitions' shards.

    The fenced owner statements (``owned``: partition → the caller's fencing token) do
    nothing in a partition whose stored token is no longer the caller's.
    """

    async def take_fences_local(self, partitions: Sequence[int], owner: str) -> dict[int, Fence]:
        """Single-node ownership: every given partition, one token above the stored one."""
        ...

    async def take_fence(
        self, partition: int, token: int, cluster_id: str, owner: str
    ) -> Fence | None:
        """Record ``token`` for ``partition`` (None: the store holds a newer one)."""
        ...

    async def fences_of(self, partitions: Sequence[int]) -> dict[int, Fence | None]:
        """The stored fence of each given partition whose store answered (None: it holds
        none); a partition whose shard is down is left out, never taken for one without."""
        ...

    async def fire_due(
        self, owned: Mapping[int, int], now: datetime, *, batch: int = ..., node_id: str = ...
    ) -> FireResult:
        """SCHEDULED → READY for due tasks of owned partitions, from their watermarks on."""
        ...

    async def fire_listed(
        self,
        owned: Mapping[int, int],
        now: datetime,
        task_ids: Sequence[str],
        *,
        node_id: str = ...,
        leases: Mapping[str, str] | None = ...,
        budgets: Mapping[str, tuple[int, int]] | None = ...,
    ) -> FireResult:
        """Fire the listed tasks of owned partitions (the timing wheel's), leasing them to
        the workers in ``leases`` when given (a hand-off)."""
        ...

    async def advance_watermarks(self, owned: Mapping[int, int], bucket: int) -> set[int]:
        """Move owned partitions' watermarks up to ``bucket``; the partitions moved."""
        ...

    async def reap_expired(
        self,
        owned: Mapping[int, int],
        now: datetime,
        *,
        batch: int = ...,
        rng: random.Random | None = ...,
    ) -> list[Task]:
        """Tasks of owned partitions whose lease ran out: retried later or DEAD."""
        ...

    async def due_soon(
        self,
        partitions: Sequence[int],
        after: datetime,
        until: datetime,
        *,
        limit: int,
        lanes: int = ...,
    ) -> list[DueSoon]:
        """SCHEDULED tasks of ``partitions`` due in ``(after, until]``, earliest first."""
        ...

    async def pending_by_bucket(
        self,
        partitions: Sequence[int],
        first: int,
        last: int,
        *,
        due_after: datetime | None = None,
    ) -> dict[tuple[int, int], int]:
        """SCHEDULED tasks per (partition, bucket) in ``[first, last]``; with ``due_after``,
        only those due later (partition loads weigh no overdue backlog)."""
        ...

    async def queue_depth(
        self, partitions: Sequence[int], first: int, last: int
    ) -> dict[tuple[str, str, str], int]:
        """Tasks per (namespace, queue, state) of ``partitions``, for the depth gauges."""
        ...

    async def purge_finished(
        self, partitions: Sequence[int], states: Sequence[TaskState], before: datetime, batch: int
    ) -> int:
        """Retention: delete up to ``batch`` finished tasks of ``partitions`` older than
        ``before``; how many went."""
        ...

    async def retire_finished(
        self,
        partitions: Sequence[int],
        before: datetime,
        now: datetime,
        *,
        retention: timedelta | None,
        width: timedelta,
        batch: int,
    ) -> Retired:
        """The history's sweep: move up to ``batch`` SUCCEEDED, CANCELLED or SKIPPED tasks
        of ``partitions`` finished before ``before`` into the history (rows past
        ``retention`` at ``now`` deleted only; each partition's shard)."""
        ...

    async def keep_history(
        self, now: datetime, *, retention: timedelta | None, width: timedelta
    ) -> SliceUpkeep:
        """Drop the history's slices past ``now`` and make those the window ahead needs,
        on every shard (one node at a time per shard)."""
        ...

    async def recount_queues(
        self,
        partitions: Sequence[int],
        now: datetime,
        counter: str,
        *,
        max_queues: int,
        states: Sequence[TaskState] = ...,
    ) -> int:
        """Replace the kept queue counts of ``partitions`` in ``states`` (default: every kept
        state) by a count of their index entries (on each partition's shard); the entries
        read."""
        ...


class ByTaskId(Protocol):
    """Statements about given tasks: each id's partition names its shard (no fan-out)."""

    async def get(self, task_id: str, namespace: str) -> Task: ...

    async def cancel(self, task_id: str, namespace: str, now: datetime) -> Task: ...

    async def heartbeat(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[HeartbeatOutcome]: ...

    async def complete(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[AckOutcome]: ...

    async def fail(
        self,
        namespace: str,
        lease: Lease,
        error: str,
        now: datetime,
        *,
        fatal: bool = ...,
        retry_after: timedelta | None = ...,
        rng: random.Random | None = ...,
    ) -> Task: ...

    async def release(self, namespace: str, lease: Lease) -> Task:
        """RUNNING → READY without spending an attempt (the caller went away)."""
        ...

    async def requeue(self, namespace: str, ids: Sequence[str], now: datetime) -> list[Task]:
        """DEAD → READY now for the given dead letters (a fresh attempt budget)."""
        ...

    async def release_handed(
        self, leases: Mapping[str, str], fired_at: datetime, now: datetime
    ) -> Counter[tuple[str, str]]:
        """Give back what a hand-off of unknown outcome may have leased (task id → worker)."""
        ...


class ByPlacement(Protocol):
    """Submits: a task's partition comes from its routing key (else it is drawn), so a
    repeated key meets its first task in one partition, where the unique index decides."""

    async def submit(self, specs: Sequence[TaskSpec], now: datetime) -> list[SubmitOutcome]: ...

    async def submit_ids(self, specs: Sequence[TaskSpec], now: datetime) -> Accepted:
        """``submit`` answering (id, created) per spec, with its effects."""
        ...

    async def submit_leased(self, spec: TaskSpec, now: datetime, worker_id: str) -> SubmitOutcome:
        """``submit`` of one task due at ``now``, leased to ``worker_id`` by its insert
        (RUNNING, attempt 1): the hand-off of a submit to a waiting worker stream."""
        ...


class ByQueue(Protocol):
    """Claims and queue limits: a queue's ready tasks may sit in any partition."""

    async def claim(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        max_tasks: int,
        now: datetime,
        *,
        limited: set[tuple[str, str]] | frozenset[tuple[str, str]] = ...,
        keyed: set[tuple[str, str]] | frozenset[tuple[str, str]] = ...,
        max_bytes: int = ...,
    ) -> list[Task]:
        """READY → RUNNING for up to ``max_tasks``. ``limited``: queues whose dispatch limit
        it takes tokens from; ``keyed``: queues limited per concurrency key, claimed under
        their limits (the plain claim takes nothing of a keyed queue)."""
        ...

    async def ready_counts(
        self, keys: Sequence[tuple[str, str]], caps: Sequence[int]
    ) -> dict[tuple[str, str], int]:
        """READY tasks per (namespace, queue), each counted up to its cap."""
        ...

    async def queue_limits(self) -> dict[tuple[str, str], tuple[float, float]]: ...

    async def set_queue_limit(
        self,
        namespace: str,
        queue: str,
        rate: float,
        burst: float,
        now: datetime,
        *,
        cap: int,
    ) -> None: ...

    # Queue settings (pause, per-key limits): written to every shard, read from the first.

    async def set_queue(
        self,
        namespace: str,
        queue: str,
        now: datetime,
        *,
        max_running_per_key: int | None = ...,
        max_starts_per_key: float | None = ...,
        cap: int,
    ) -> QueueSettings:
        """Set a queue's per-key limits (None: keep; 0: none); ``NamespaceCapReached`` past
        ``cap`` queues with settings in the namespace."""
        ...

    async def pause_queue(
        self, namespace: str, queue: str, now: datetime, *, cap: int
    ) -> QueueSettings:
        """Pause a queue cluster-wide: its tasks still fire, no claim takes them."""
        ...

    async def resume_queue(self, namespace: str, queue: str, now: datetime) -> Resumed:
        """End a pause, after skipping the READY tasks its misfire policy skips."""
        ...

    async def queue_settings(self, namespace: str, queue: str) -> QueueSettings:
        """A queue's settings (the defaults when it has none)."""
        ...

    async def list_queue_settings(self, namespace: str, *, limit: int) -> list[QueueSettings]:
        ...

    async def gated_queues(self) -> list[QueueSettings]:
        """Every queue paused or limited per key (what the dispatch gate holds)."""
        ...


class Admin(Protocol):
    """Listings and counts over every partition (a sharded store fans out and merges)."""

    async def list_tasks(
        self,
        namespace: str,
        *,
        queue: str | None = ...,
        state: TaskState | None = ...,
        page_size: int = ...,
        page_token: str = ...,
        max_bytes: int = ...,
        labels: tuple[tuple[str, str], ...] = ...,
        run_at_from: datetime | None = ...,
        run_at_to: datetime | None = ...,
    ) -> Page:
        """A keyset page of a namespace's tasks (``state=DEAD``: its dead letters); filtered
        by labels or run_at, a page may hold fewer tasks than asked before its next token."""
        ...

    async def bulk_where(
        self,
        action: BulkAction,
        namespace: str,
        where: TaskFilter,
        now: datetime,
        *,
        dry_run: bool = ...,
        page_token: str = ...,
        max_tasks: int = ...,
        deadline_s: float = ...,
    ) -> BulkDone:
        """Cancel, requeue or run now the tasks ``where`` matches, in bounded batches from
        ``page_token`` on (``chronoq.store.bulk``); the answer says where it stopped."""
        ...

    async def queue_counts(
        self, namespace: str, states: Sequence[TaskState], *, max_tasks: int, max_queues: int
    ) -> QueueCounts: ...

    async def count_by_state(self) -> dict[TaskState, int]: ...

    async def kept_counts(
        self, namespace: str, queues: Sequence[str] | None, *, max_queues: int
    ) -> KeptCounts:
        """``namespace``'s queue counts as the owners keep them (every shard's, merged)."""
        ...

    async def kept_ready(self) -> dict[tuple[str, str], int]:
        """READY tasks per (namespace, queue), as kept (the queue gauges)."""
        ...

    async def label_counts(
        self, namespace: str, label_key: str, queues: Sequence[str] | None, *, max_tasks: int
    ) -> tuple[list[tuple[str, str, TaskState, int]], bool]:
        """Tasks by (queue, label value, state), read up to ``max_tasks`` per state (and
        shard); True when that bound was reached somewhere (lower bounds)."""
        ...

    async def oldest_ready(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], datetime]:
        """The oldest READY task's run_at of each (namespace, queue) that has one."""
        ...

    async def fences(self) -> list[Fence]:
        """Every partition's stored fence (token, owner, watermark)."""
        ...


class Listening(Protocol):
    """A subscription to notices, until closed."""

    @property
    def closed(self) -> bool: ...

    async def close(self) -> None: ...


class Notices(Protocol):
    """Notices between nodes through the store (NOTIFY and LISTEN on PostgreSQL)."""

    async def announce(self, channel: str, payloads: Sequence[str]) -> None: ...

    async def listen(self, channel: str, on_notice: Callable[[str], None]) -> Listening: ...


class Reachable(Protocol):
    """Whether the store answers: all of it (health, status), or any of it (the store watch:
    one shard down is that shard's watch's business, not a node cut off from the store)."""

    async def probe(self, timeout: float = ...) -> bool: ...

    async def probe_any(self, timeout: float = ...) -> bool: ...


class ServerClock(Protocol):
    """The store server's clock, which the clock check compares the node's with (with
    shards: each shard's server)."""

    def server_clock(self) -> AbstractAsyncContextManager[Callable[[], Awaitable[datetime]]]:
        """A reader of the server's clock, valid inside the block."""
        ...


class TaskStore(
    ByPartition, ByTaskId, ByPlacement, ByQueue, Admin, Notices, Reachable, ServerClock, Protocol
):
    """The whole task store: every port above (the node's servicers take this one)."""

    async def close(self) -> None: ...


class ScheduleOwner(Protocol):
    """Schedule materialisation: fenced, by partition (a schedule and its occurrences share
    one partition, so they commit in one transaction)."""

    async def materialize(
        self,
        owned: Mapping[int, int],
        now: datetime,
        *,
        lookahead: timedelta = ...,
        batch: int = ...,
        per_schedule: int = ...,
        charge: Charge | None = ...,
        spent: Sequence[str] = ...,
    ) -> Materialized: ...


class ScheduleAdmin(Protocol):
    """Schedules CRUD, addressed by (namespace, name)."""

    async def create(
        self,
        spec: ScheduleSpec,
        now: datetime,
        *,
        cap: int | None = ...,
        quota: float | None = ...,
    ) -> Schedule: ...

    async def get(self, namespace: str, name: str) -> Schedule: ...

    async def list_page(
        self, namespace: str, *, page_size: int = ..., after: str = ...
    ) -> list[Schedule]: ...

    async def pause(self, namespace: str, name: str, now: datetime) -> Schedule: ...

    async def resume(
        self, namespace: str, name: str, now: datetime, *, quota: float | None = ...
    ) -> Schedule: ...

    async def delete(self, namespace: str, name: str, now: datetime) -> None: ...


if TYPE_CHECKING:
    # The PostgreSQL store implements the port (checked by mypy, nothing runs).
    from chronoq.store.schedules import Schedules
    from chronoq.store.store import Store

    _store: type[TaskStore] = Store
    _schedule_owner: type[ScheduleOwner] = Schedules
    _schedule_admin: type[ScheduleAdmin] = Schedules

    # So does the store of shards (chronoq.store.sharded).
    from chronoq.store.sharded import ShardedSchedules, ShardedStore

    _sharded: type[TaskStore] = ShardedStore
    _sharded_owner: type[ScheduleOwner] = ShardedSchedules
    _sharded_admin: type[ScheduleAdmin] = ShardedSchedules
