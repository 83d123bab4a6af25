"""Operator statements: requeue of dead tasks, queue limits, retention, counts and depths."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from chronoq.buckets import bucket_of
from chronoq.errors import InvalidArgument, NamespaceCapReached, UniqueKeyTaken
from chronoq.models import QueueCount, QueueCounts, Task, TaskState
from chronoq.store.connection import Connected
from chronoq.store.keyed import UNIQUE_PENDING
from chronoq.store.rows import known, parse_task_id, task_of
from chronoq.store.sql import q

#: States ``queue_counts`` counts: those of its index (tasks_queue_states).
COUNTABLE_STATES = frozenset(
    {TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING, TaskState.DEAD}
)


class _Abort(InvalidArgument):
    def __init__(self, task_id: str) -> None:
        super().__init__(
            "ids", f"task {task_id} is not DEAD (or does not exist); nothing was requeued"
        )


class OperatorStatements(Connected):
    """The statements of operators and of the node's status and housekeeping: requeue,
    queue limits, purge, counts."""

    async def requeue(self, namespace: str, ids: Sequence[str], now: datetime) -> list[Task]:
        """DEAD → READY now, with a fresh attempt budget. All or none."""
        if not ids:
            raise InvalidArgument("ids", "name at least one dead task")
        parsed = [parse_task_id(i) for i in ids]
        try:
            async with self.connection() as conn, conn.transaction():
                rows = await conn.fetch(
                    self._q("requeue_dead"),
                    parsed,
                    namespace,
                    now,
                    bucket_of(now, self.bucket_seconds),
                )
                if len(rows) != len(set(parsed)):
                    done = {str(r["id"]) for r in rows}
                    bad = next(i for i in ids if str(parse_task_id(i)) not in done)
                    raise _Abort(bad)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != UNIQUE_PENDING:
                raise
            raise await self._unique_taken(parsed, namespace) from None
        return [task_of(r) for r in rows]

    async def _unique_taken(self, ids: list[Any], namespace: str) -> UniqueKeyTaken:
        """Why a requeue collided on a unique key: which task, and which pending one holds it
        (two dead tasks of one key requeued together hold it against each other)."""
        async with self.connection() as conn:
            row = await conn.fetchrow(q("unique_blockers"), ids, namespace)
        if row is None:
            return UniqueKeyTaken(str(ids[0]), "(shared by the tasks requeued)", "among them")
        return UniqueKeyTaken(str(row["id"]), row["unique_key"], str(row["holder"]))

    async def ready_counts(
        self, keys: Sequence[tuple[str, str]], caps: Sequence[int]
    ) -> dict[tuple[str, str], int]:
        """READY tasks per (namespace, queue) of ``keys``, each counted up to its cap."""
        if not keys:
            return {}
        async with self.connection() as conn:
            rows = await conn.fetch(
                q("ready_counts"), [k[0] for k in keys], [k[1] for k in keys], list(caps)
            )
        return {(r["namespace"], r["queue"]): r["n"] for r in rows}

    async def queue_counts(
        self, namespace: str, states: Sequence[TaskState], *, max_tasks: int, max_queues: int
    ) -> QueueCounts:
        """``namespace``'s tasks in ``states`` (live ones and DEAD) by queue, from an index
        alone: at most ``max_tasks`` entries read and ``max_queues`` queues answered per state."""
        if not set(states) <= COUNTABLE_STATES:
            raise InvalidArgument(
                "states", "countable: scheduled, ready, running and dead (finished ones grow)"
            )
        async with self.connection() as conn:
            rows = await conn.fetch(
                q("queue_counts"), namespace, [int(s) for s in states], max_tasks, max_queues
            )
        counts = [QueueCount(r["queue"], TaskState(r["state"]), r["n"], r["oldest"]) for r in rows]
        capped = {TaskState(r["state"]) for r in rows if r["read"] >= max_tasks}
        truncated = {TaskState(r["state"]) for r in rows if r["groups"] > max_queues}
        return QueueCounts(counts, frozenset(capped), frozenset(truncated))

    async def pending_by_bucket(
        self,
        partitions: Sequence[int],
        first: int,
        last: int,
        *,
        due_after: datetime | None = None,
    ) -> dict[tuple[int, int], int]:
        """Pending (SCHEDULED) tasks per (partition, bucket) over ``first..last``, those due
        after ``due_after`` only when given."""
        async with self.connection() as conn:
            rows = await conn.fetch(
                q("pending_by_bucket"), list(partitions), first, last, due_after
            )
        return {(r["partition"], r["bucket"]): r["pending"] for r in rows}

    async def queue_depth(
        self, partitions: Sequence[int], first: int, last: int
    ) -> dict[tuple[str, str, str], int]:
        """(namespace, queue, state name) → tasks: READY and RUNNING, and SCHEDULED in the
        buckets ``first..last`` of ``partitions``."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("queue_depth"), list(partitions), first, last)
        return {(r["namespace"], r["queue"], TaskState(r["state"]).name): r["n"] for r in rows}

    async def purge_finished(
        self, partitions: Sequence[int], states: Sequence[TaskState], before: datetime, batch: int
    ) -> int:
        """Delete up to ``batch`` tasks in ``states`` that finished before ``before``."""
        if not partitions:
            return 0
        async with self.connection() as conn:
            status = await conn.execute(
                self._q("purge_finished"), list(partitions), [int(s) for s in states], before, batch
            )
        return int(status.split()[-1])

    async def set_queue_limit(
        self,
        namespace: str,
        queue: str,
        rate: float,
        burst: float,
        now: datetime,
        *,
        cap: int,
    ) -> None:
        """Limit dispatch of a queue to ``rate`` tasks/s across the cluster; rate 0 removes it.

        A namespace holds at most ``cap`` limits (``NamespaceCapReached`` for one more);
        changing or removing one is always allowed.
        """
        async with self.connection() as conn:
            if rate <= 0:
                await conn.execute(q("delete_queue_limit"), namespace, queue)
                return
            row = await conn.fetchrow(q("set_queue_limit"), namespace, queue, rate, burst, now, cap)
        if row is None:
            raise NamespaceCapReached(namespace, "queue limits", cap)

    async def take_tokens(self, namespace: str, queue: str, most: int, now: datetime) -> int | None:
        """Up to ``most`` dispatch tokens of a limited queue (refilled by ``now``); None: the
        queue has no limit here. For a claim made on another store (a store of shards)."""
        async with self.connection() as conn:
            granted: int | None = await conn.fetchval(q("take_tokens"), namespace, queue, most, now)
        return granted

    async def return_tokens(self, namespace: str, queue: str, n: int) -> None:
        """Give back ``n`` tokens a claim took and did not use (at most the burst stays)."""
        if n > 0:
            async with self.connection() as conn:
                await conn.execute(q("return_tokens"), namespace, queue, n)

    async def queue_limits(self) -> dict[tuple[str, str], tuple[float, float]]:
        async with self.connection() as conn:
            rows = await conn.fetch(q("queue_limits"))
        return {(r["namespace"], r["queue"]): (r["rate"], r["burst"]) for r in rows}

    async def count_by_state(self) -> dict[TaskState, int]:
        """Exact counts per state of ``tasks``: a full scan, for tests, demos and small tables
        only. SUCCEEDED, CANCELLED and SKIPPED are those of the last ``history_after`` (the
        history, which grows with the retention window, is not counted)."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("count_by_state"))
        counts: Counter[TaskState] = Counter()
        for r in rows:  # a state no version knows counts as DEAD, as a task reads
            counts[known(TaskState, r["state"], TaskState.DEAD)] += r["n"]
        return dict(counts)
