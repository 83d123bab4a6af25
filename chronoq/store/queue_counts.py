"""Statements of the queue counts the partition owners keep (migration 0021): the recount of
some partitions from an index, and the reads a QueueCounts call and the queue gauges sum."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from chronoq.models import TaskState
from chronoq.queuecounts import KEPT_STATES, KeptCounts
from chronoq.store.connection import Connected
from chronoq.store.rows import known
from chronoq.store.sql import q


class QueueCountStatements(Connected):
    """The kept counts of one database."""

    async def recount_queues(
        self,
        partitions: Sequence[int],
        now: datetime,
        counter: str,
        *,
        max_queues: int,
        states: Sequence[TaskState] = KEPT_STATES,
    ) -> int:
        """Replace the kept counts of ``partitions`` in ``states`` by a count of their index
        entries, in one statement (readers see the old or the new counts); the entries read."""
        if not partitions:
            return 0
        ps = sorted(set(partitions))
        async with self.connection() as conn, conn.transaction():
            await conn.execute(q("lock_queue_recount"), ps)
            codes = sorted({int(s) for s in states})
            read = await conn.fetchval(q("recount_queue_counts"), ps, max_queues, codes)
            full = set(codes) >= {int(s) for s in KEPT_STATES}
            await conn.execute(q("mark_queue_counts"), ps, now, counter, full)
        return int(read)

    async def kept_counts(
        self, namespace: str, queues: Sequence[str] | None, *, max_queues: int
    ) -> KeptCounts:
        """``namespace``'s kept counts on this database: per (queue, state) of ``queues``
        (None: the first ``max_queues`` in queue order), totals per state, the oldest count
        summed, and the oldest READY task of each queue answered (one index probe each)."""
        names = None if queues is None else list(queues)
        async with self.connection() as conn:
            rows = await conn.fetch(q("kept_queue_counts"), namespace, names, 4 * (max_queues + 1))
            # Named queues' totals are their own rows' sums (``snapshot``): not read again.
            totals = (
                [] if names is not None else await conn.fetch(q("kept_state_totals"), namespace)
            )
            at = await conn.fetchrow(q("queue_counts_as_of"))
            probed = names if names is not None else sorted({r["queue"] for r in rows} - {""})
            probed = probed[:max_queues]
            oldest = await conn.fetch(q("oldest_ready"), [namespace] * len(probed), probed)
        return KeptCounts(
            rows={(r["queue"], known(TaskState, r["state"], TaskState.DEAD)): r["n"] for r in rows},
            totals={known(TaskState, r["state"], TaskState.DEAD): r["n"] for r in totals},
            as_of=at["as_of"],
            live_as_of=at["live_as_of"],
            counted=int(at["counted"]),
            oldest_ready={r["queue"]: r["oldest"] for r in oldest if r["oldest"] is not None},
        )

    async def kept_ready(self) -> dict[tuple[str, str], int]:
        """READY tasks per (namespace, queue) of every namespace, as kept here."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("kept_ready"))
        return {(r["namespace"], r["queue"]): r["n"] for r in rows}

    async def oldest_ready(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], datetime]:
        """The oldest READY task's run_at of each (namespace, queue) of ``keys`` that has one."""
        if not keys:
            return {}
        async with self.connection() as conn:
            rows = await conn.fetch(q("oldest_ready"), [k[0] for k in keys], [k[1] for k in keys])
        return {(r["namespace"], r["queue"]): r["oldest"] for r in rows if r["oldest"] is not None}

    async def label_counts(
        self,
        namespace: str,
        label_key: str,
        queues: Sequence[str] | None,
        *,
        max_tasks: int,
    ) -> tuple[list[tuple[str, str, TaskState, int]], bool]:
        """``namespace``'s tasks by (queue, value of ``label_key``, state), at most
        ``max_tasks`` read per state; True when a state reached it (lower bounds)."""
        names = None if queues is None else list(queues)
        states = [int(s) for s in KEPT_STATES]
        async with self.connection() as conn:
            rows = await conn.fetch(
                q("label_counts"), namespace, label_key, states, names, max_tasks
            )
        out = [
            (r["queue"], r["value"], known(TaskState, r["state"], TaskState.DEAD), r["n"])
            for r in rows
        ]
        return out, any(r["read"] >= max_tasks for r in rows)
