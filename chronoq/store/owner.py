"""Owner statements: fences, firing, watermarks, reaping, quarantine.

Every statement here carries the partition's fencing token and does nothing when the stored
token is no longer the caller's.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from chronoq.buckets import bucket_of
from chronoq.limits import MAX_ANSWER_BYTES, TASK_FIXED_BYTES
from chronoq.models import Task, TaskState
from chronoq.saturating import ms_of
from chronoq.store.connection import Connected
from chronoq.store.quarantine import POISON, isolate, reason
from chronoq.store.rows import Fence, FireResult, parse_task_id, retry_decision, task_of
from chronoq.store.sql import q

log = logging.getLogger("chronoq.store")

#: (bucket, namespace) lanes per partition that one due-soon read walks at most: a partition
#: with more namespaces due in the window leaves the rest to the firing tick.
DUE_SOON_LANES = 64


class OwnerStatements(Connected):
    """The statements of a partition's owner, each fenced by the owner's token."""

    async def take_fences_local(self, partitions: Sequence[int], owner: str) -> dict[int, Fence]:
        """Take every listed partition with a token one above the stored one (single node)."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("take_fences_local"), list(partitions), owner, "local")
        return {
            r["partition"]: Fence(r["partition"], r["token"], r["watermark"], owner) for r in rows
        }

    async def take_fence(
        self, partition: int, token: int, cluster_id: str, owner: str
    ) -> Fence | None:
        """Record ``token`` as the partition's current one; None if a newer token is stored."""
        async with self.connection() as conn:
            row = await conn.fetchrow(q("take_fence"), partition, token, owner, cluster_id)
        if row is None:
            return None
        return Fence(row["partition"], row["token"], row["watermark"], owner, cluster_id)

    async def fences(self) -> list[Fence]:
        async with self.connection() as conn:
            rows = await conn.fetch(q("fences"))
        return [
            Fence(r["partition"], r["token"], r["watermark"], r["owner"], r["cluster_id"])
            for r in rows
        ]

    async def fences_of(self, partitions: Sequence[int]) -> dict[int, Fence | None]:
        stored = {f.partition: f for f in await self.fences()}
        return {p: stored.get(p) for p in partitions}

    async def fire_due(
        self, owned: Mapping[int, int], now: datetime, *, batch: int = 1000, node_id: str = ""
    ) -> FireResult:
        """Fire up to ``batch`` due tasks of each owned partition (partition → token).

        Each namespace with due rows in a partition takes an equal share of its batch (see
        ``fair_due`` in queries.sql), so a flood in one cannot hold back the others; the
        partitions where a share was filled are in ``unfinished``.

        Should the statement still fail on a row's data, the same due rows are fired in
        halves down to the ones that fail alone; those are quarantined (DEAD, with the
        reason, counted in ``quarantined`` and against their partition's batch) and the
        others fire in this same call. Every statement on the way is fenced.
        """
        result = FireResult()
        if not owned:
            return result
        parts, tokens = list(owned), list(owned.values())
        bucket = bucket_of(now, self.bucket_seconds)
        horizon_ms = ms_of(self.horizon)
        async with self.connection() as conn:
            try:
                rows = list(
                    await conn.fetch(
                        self._q("fire_due"), parts, tokens, bucket, now, batch, node_id, horizon_ms
                    )
                )
            except POISON:
                due = await conn.fetch(self._q("due_task_ids"), parts, tokens, bucket, now, batch)
                result.unfinished.update(r["partition"] for r in due if r["more"])
                rows = []

                async def fire(ids: Sequence[Any]) -> None:
                    fired = await conn.fetch(
                        self._q("fire_ids"),
                        parts,
                        tokens,
                        bucket,
                        now,
                        list(ids),
                        node_id,
                        horizon_ms,
                    )
                    rows.extend(fired)

                async def poisoned(task_id: Any, exc: BaseException) -> None:
                    result.quarantined.extend(
                        await self._quarantine(conn, owned, now, task_id, TaskState.SCHEDULED, exc)
                    )

                await isolate([r["id"] for r in due], fire, poisoned)
        for task in result.quarantined:
            result.per_partition[task.partition] += 1
        _count_fired(result, rows)
        return result

    async def due_soon(
        self,
        partitions: Sequence[int],
        after: datetime,
        until: datetime,
        *,
        limit: int,
        lanes: int = DUE_SOON_LANES,
    ) -> list[tuple[str, int, datetime, str, str]]:
        """(task id, partition, run_at, namespace, queue) of the SCHEDULED tasks of
        ``partitions`` due in (``after``, ``until``], earliest first, at most ``limit``: what
        an owner's timing wheel holds. Reads the current and next buckets' index ranges only;
        fires nothing."""
        if not partitions or limit <= 0 or until <= after:
            return []
        first, last = bucket_of(after, self.bucket_seconds), bucket_of(until, self.bucket_seconds)
        async with self.connection() as conn:
            rows = await conn.fetch(
                q("due_soon"), list(partitions), first, last, after, until, limit, lanes
            )
        return [
            (str(r["id"]), r["partition"], r["run_at"], r["namespace"], r["queue"]) for r in rows
        ]

    async def fire_listed(
        self,
        owned: Mapping[int, int],
        now: datetime,
        task_ids: Sequence[str],
        *,
        node_id: str = "",
        leases: Mapping[str, str] | None = None,
        budgets: Mapping[str, tuple[int, int]] | None = None,
    ) -> FireResult:
        """Fire the listed tasks of owned partitions (partition → token) that are still
        SCHEDULED and due at ``now`` (``run_at <= now`` in the statement too), fenced like
        ``fire_due``. A row the statement cannot fire is left to ``fire_due``, which sets it
        aside; nothing is retried here.

        ``leases`` (task id → worker id) hands those tasks straight to their workers in the
        same write: RUNNING, leased as by a claim; they come back in ``FireResult.leased``.
        ``budgets`` (task id → (stream, bytes), each lease's stream and that stream's byte
        budget) bounds what is leased per stream: its tasks while they fit (always one), the
        rest fire READY. A lease without one has the answer budget."""
        result = FireResult()
        if not owned or not task_ids:
            return result
        bucket = bucket_of(now, self.bucket_seconds)
        args: list[Any] = [
            list(owned),
            list(owned.values()),
            bucket,
            now,
            [parse_task_id(t) for t in task_ids],
            node_id,
            ms_of(self.horizon),
        ]
        if leases:
            budget = budgets or {}
            args += [
                [parse_task_id(t) for t in leases],
                list(leases.values()),
                *self.lease_bounds_ms,
                [budget.get(t, (-1, 0))[0] for t in leases],
                [budget.get(t, (-1, MAX_ANSWER_BYTES))[1] for t in leases],
                TASK_FIXED_BYTES,
            ]
        async with self.connection() as conn:
            try:
                statement = self._q("fire_ids_leasing" if leases else "fire_ids")
                rows = await conn.fetch(statement, *args)
            except POISON as exc:
                log.debug("listed fire failed on a row's data (the tick isolates it): %s", exc)
                return result
        _count_fired(result, rows)
        return result

    async def release_handed(
        self, leases: Mapping[str, str], fired_at: datetime, now: datetime
    ) -> Counter[tuple[str, str]]:
        """Give back the tasks a hand-off fired at ``fired_at`` may have leased (task id →
        worker id) when its outcome is unknown, unless their leases ran out by ``now``; the
        ready count per (namespace, queue)."""
        if not leases:
            return Counter()
        async with self.connection() as conn:
            rows = await conn.fetch(
                self._q("release_handed"),
                [parse_task_id(t) for t in leases],
                list(leases.values()),
                fired_at,
                now,
            )
        return Counter((r["namespace"], r["queue"]) for r in rows)

    async def _quarantine(
        self,
        conn: Any,
        owned: Mapping[int, int],
        now: datetime,
        task_id: Any,
        expected: TaskState,
        exc: BaseException,
    ) -> list[Task]:
        """Set one task that an owner statement could not process aside: DEAD, with the
        reason. Fenced like that statement, and only from the state it expected."""
        why = reason(exc)
        fences = (list(owned), list(owned.values()))
        rows = await conn.fetch(
            self._q("quarantine_tasks"), *fences, [task_id], now, int(expected), why
        )
        tasks = [task_of(r) for r in rows]
        for task in tasks:
            log.warning("quarantined task %s (%s/%s): %s", task.id, task.namespace, task.queue, why)
        return tasks

    async def advance_watermarks(self, owned: Mapping[int, int], bucket: int) -> set[int]:
        """Record that every bucket before ``bucket`` is fired, for partitions still ours."""
        if not owned:
            return set()
        async with self.connection() as conn:
            rows = await conn.fetch(
                q("advance_watermarks"), list(owned), list(owned.values()), bucket
            )
        return {r["partition"] for r in rows}

    async def reap_expired(
        self,
        owned: Mapping[int, int],
        now: datetime,
        *,
        batch: int = 1000,
        rng: random.Random | None = None,
    ) -> list[Task]:
        """Running tasks whose lease expired go back to waiting (attempt used) or DEAD.

        A row whose retry cannot be computed or written is found by halving the batch (each
        try in a savepoint) and quarantined: DEAD, with the reason, among the returned tasks;
        the rest of the batch is reaped in the same transaction, under the same fences.
        """
        if not owned:
            return []
        done: list[Task] = []
        async with self.connection() as conn, conn.transaction():
            fences = (list(owned), list(owned.values()))
            rows = await conn.fetch(
                self._q("expired_leases"), *fences, now, batch, ms_of(self.horizon)
            )

            async def retry(chunk: Sequence[Any]) -> None:
                async with conn.transaction():  # a savepoint: a failed try leaves nothing
                    cols = self._retry_columns(chunk, now, rng)
                    retried = await conn.fetch(self._q("retry_running"), *cols, now)
                    tasks = [task_of(r) for r in retried]
                done.extend(tasks)

            async def poisoned(row: Any, exc: BaseException) -> None:
                done.extend(
                    await self._quarantine(conn, owned, now, row["id"], TaskState.RUNNING, exc)
                )

            await isolate(rows, retry, poisoned)
        return done

    def _retry_columns(
        self, rows: Sequence[Any], now: datetime, rng: random.Random | None
    ) -> list[list[Any]]:
        """The column arrays of ``retry_running`` for expired leases."""
        cols: list[list[Any]] = [[] for _ in range(6)]
        for r in rows:
            state, run_at = retry_decision(r, now, horizon=self.horizon, rng=rng)
            error = f"lease expired (worker {r['worker_id'] or '?'}, attempt {r['attempt']})"
            values = (
                r["id"],
                r["attempt"],
                int(state),
                run_at,
                bucket_of(run_at, self.bucket_seconds),
                error,
            )
            for col, value in zip(cols, values, strict=True):
                col.append(value)
        return cols


def _count_fired(result: FireResult, rows: Sequence[Any]) -> None:
    """Add what a fire statement returned (one row per task it fired or skipped) to ``result``."""
    for r in rows:
        result.per_partition[r["partition"]] += 1
        if r.get("more"):
            result.unfinished.add(r["partition"])
        if r["state"] == TaskState.SKIPPED:
            result.skipped += 1
        else:
            result.fired += 1
            if r.get("leased"):
                result.leased.append(task_of(r))
            else:
                result.ready_by_queue[(r["namespace"], r["queue"])] += 1
            result.lateness.append(r["lateness"])
            if r.get("trace_context") is not None:  # chronoq.tracing: a fire span
                result.traced.append((r["trace_context"], r["lateness"]))
