"""Client and worker statements: submit, get, cancel, list; claim, heartbeat, complete,
fail, release. Each state change is one conditional UPDATE whose rows decide who won."""

from __future__ import annotations

import contextlib
import logging
import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from chronoq.buckets import bucket_of
from chronoq.errors import InvalidArgument, InvalidTransition, StaleLease, TaskNotFound
from chronoq.limits import (
    MAX_ANSWER_BYTES,
    MAX_ERROR_MESSAGE,
    MAX_PAGE_SIZE,
    TASK_FIXED_BYTES,
    task_bytes,
)
from chronoq.models import (
    AckOutcome,
    HeartbeatOutcome,
    Lease,
    LeaseMiss,
    Page,
    Task,
    TaskState,
)
from chronoq.store import key_claims
from chronoq.store.bulk import list_filtered
from chronoq.store.quarantine import POISON, reason
from chronoq.store.rows import known, parse_task_id, retry_decision, task_of
from chronoq.store.sql import q
from chronoq.store.task_inserts import TaskInserts
from chronoq.taskfilter import TaskFilter
from chronoq.timeslice import converted

log = logging.getLogger("chronoq.store")

_ZERO_UUID = uuid.UUID(int=0)
#: Bytes a page of a listing or a claim holds at most (unless one task alone is larger): the
#: one answer budget (see ``chronoq.limits``), so eight concurrent listings of 256 KiB payloads
#: hold tens of megabytes on a node, not gigabytes.
PAGE_BYTES = MAX_ANSWER_BYTES
#: What a listed task costs besides its strings: ids, times, numbers and framing.
ROW_BYTES = TASK_FIXED_BYTES



def _lease_columns(leases: Sequence[Lease]) -> tuple[list[uuid.UUID], list[int]]:
    return [parse_task_id(lease.task_id) for lease in leases], [
        lease.lease_token for lease in leases
    ]


async def _completed_by(
    conn: asyncpg.Connection, namespace: str, leases: Sequence[Lease], ok: set[str]
) -> set[str]:
    """The tasks among the misses that are SUCCEEDED by the very attempt of their lease."""
    missed = [lease for lease in leases if lease.task_id not in ok]
    if not missed:
        return set()
    ids, tokens = _lease_columns(missed)
    rows = await conn.fetch(q("completed_by"), namespace, ids, tokens)
    return {str(r["id"]) for r in rows}


async def _explain_misses(
    conn: asyncpg.Connection, namespace: str, leases: Sequence[Lease], ok: set[str]
) -> dict[str, tuple[LeaseMiss, str]]:
    """Why each lease not in ``ok`` missed, as a reason and in words."""
    missed = [lease for lease in leases if lease.task_id not in ok]
    if not missed:
        return {}
    rows = await conn.fetch(
        q("lease_states"), namespace, [parse_task_id(m.task_id) for m in missed]
    )
    found = {str(r["id"]): r for r in rows}
    out: dict[str, tuple[LeaseMiss, str]] = {}
    for m in missed:
        r = found.get(m.task_id)
        if r is None:
            out[m.task_id] = (LeaseMiss.NO_TASK, f"no task {m.task_id} in namespace {namespace!r}")
            continue
        state = known(TaskState, r["state"], TaskState.DEAD)
        if state is TaskState.CANCELLED:
            out[m.task_id] = (LeaseMiss.CANCELLED, "the task was cancelled")
        elif state is not TaskState.RUNNING:
            out[m.task_id] = (LeaseMiss.NOT_RUNNING, f"the task is {state.name}, not RUNNING")
        else:
            out[m.task_id] = (
                LeaseMiss.STALE,
                f"lease token {m.lease_token} is stale; the current attempt is {r['attempt']}",
            )
    return out


def _check_lease(row: Any, lease: Lease, namespace: str) -> None:
    if row is None:
        raise TaskNotFound(lease.task_id, namespace)
    state = known(TaskState, row["state"], TaskState.DEAD)
    if state is not TaskState.RUNNING:
        raise StaleLease(lease.task_id, lease.lease_token, f"the task is {state.name}, not RUNNING")
    if row["attempt"] != lease.lease_token:
        raise StaleLease(
            lease.task_id, lease.lease_token, f"the current attempt is {row['attempt']}"
        )


class TaskStatements(TaskInserts):
    """The statements of clients (submit, get, cancel, list) and workers (claim, heartbeat,
    complete, fail, release)."""

    # ---------------------------------------------------------------- clients

    async def get(self, task_id: str, namespace: str) -> Task:
        async with self.connection() as conn:
            row = await conn.fetchrow(q("get_task"), parse_task_id(task_id), namespace)
        if row is None:
            raise TaskNotFound(task_id, namespace)
        return task_of(row)

    async def cancel(self, task_id: str, namespace: str, now: datetime) -> Task:
        """SCHEDULED, READY, RUNNING or DEAD → CANCELLED (for a dead letter: discarded, no
        longer listed as dead). A running worker learns it by heartbeat."""
        async with self.connection() as conn:
            row = await conn.fetchrow(self._q("cancel"), parse_task_id(task_id), namespace, now)
        if row is not None:
            return task_of(row)
        current = await self.get(task_id, namespace)
        raise InvalidTransition(task_id, current.state.name, "cancel")

    async def list_tasks(
        self,
        namespace: str,
        *,
        queue: str | None = None,
        state: TaskState | None = None,
        page_size: int = 100,
        page_token: str = "",
        max_bytes: int = PAGE_BYTES,
        labels: tuple[tuple[str, str], ...] = (),
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
    ) -> Page:
        """A page of tasks ordered by id; pass ``next_token`` back for the next page.

        The page ends early rather than pass ``max_bytes`` (it always holds one task), so a page
        of large payloads costs the node megabytes, not ``page_size`` times the payload limit.
        Filtered by ``labels`` (every pair) or a run_at range ``[run_at_from, run_at_to)``, a
        page reads a bounded stretch of the namespace and may hold fewer tasks, even none,
        before its next token (``chronoq.store.bulk.list_filtered``)."""
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument("page_size", f"must be between 1 and {MAX_PAGE_SIZE}")
        after = _ZERO_UUID
        if page_token:
            try:
                after = uuid.UUID(page_token)
            except ValueError:
                raise InvalidArgument("page_token", "is not a token from a previous page") from None
        where = TaskFilter(queue, labels, state, run_at_from, run_at_to)
        if where.narrowed:
            async with self.connection() as conn:
                return await list_filtered(
                    conn,
                    namespace,
                    where,
                    page_size=page_size,
                    after=after,
                    max_bytes=max_bytes,
                    row_bytes=ROW_BYTES,
                )
        query = q("list_tasks") if state is None else q("list_tasks_in_state")
        async with self.connection() as conn:
            rows = await conn.fetch(
                query,
                namespace,
                None if state is None else int(state),
                queue,
                after,
                page_size,
                max_bytes,
                ROW_BYTES,
            )
        tasks = await converted(rows, task_of)
        candidates = rows[0]["page_rows"] if rows else 0
        more = candidates == page_size or len(rows) < candidates
        return Page(tasks, tasks[-1].id if more else "")

    # ---------------------------------------------------------------- workers

    async def claim(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        max_tasks: int,
        now: datetime,
        *,
        limited: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
        keyed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
        max_bytes: int = MAX_ANSWER_BYTES,
        strict_bytes: bool = False,
    ) -> list[Task]:
        """READY → RUNNING for up to ``max_tasks``; each gets attempt + 1 as its lease token.

        The claim stops before its tasks pass ``max_bytes`` in an answer (it always takes one,
        if any is ready, unless ``strict_bytes``), so what it leases can be sent. Queues in
        ``limited`` have a cluster-wide dispatch limit: tokens are taken from their bucket
        first, and the ones a claim did not use are given back. Queues in ``keyed`` limit
        their tasks per concurrency key (``chronoq.store.key_claims``); the plain claim
        statement takes no task of a queue whose settings limit it per key, so a caller that
        does not know a queue is keyed yet claims nothing from it, never past its limits.
        """
        mine = [queue for queue in queues if (namespace, queue) in keyed]
        serial = self.key_cursors.serial(namespace, mine) if mine else contextlib.nullcontext()
        async with serial, self.connection() as conn:
            caps = []
            for queue in queues:
                cap = max_tasks
                if (namespace, queue) in limited:
                    granted = await conn.fetchval(
                        q("take_tokens"), namespace, queue, max_tasks, now
                    )
                    cap = max_tasks if granted is None else granted
                caps.append(cap)
            if not any(caps):
                return []
            budget = -max_bytes if strict_bytes else max_bytes  # negative: strict (claim)
            if keyed and any((namespace, queue) in keyed for queue in queues):
                rows = await self._claim_split(
                    conn, namespace, queues, keyed, max_tasks, worker_id, now, caps, budget
                )
            else:
                rows = await self._claim_rows(
                    conn, namespace, queues, max_tasks, worker_id, now, caps, budget
                )
            for queue, cap in zip(queues, caps, strict=True):
                if (namespace, queue) in limited:
                    used = sum(1 for r in rows if r["queue"] == queue)
                    if cap > used:
                        await conn.execute(q("return_tokens"), namespace, queue, cap - used)
        tasks = await converted(rows, task_of)
        tasks.sort(key=lambda t: (-t.priority, t.run_at))
        return tasks

    async def _claim_split(
        self,
        conn: Any,
        namespace: str,
        queues: Sequence[str],
        keyed: set[tuple[str, str]] | frozenset[tuple[str, str]],
        max_tasks: int,
        worker_id: str,
        now: datetime,
        caps: list[int],
        budget: int,
    ) -> list[Any]:
        """A claim of keyed and plain queues: the plain ones' statement first, then the keyed
        ones' transaction for what is left of ``max_tasks`` and of the byte ``budget``."""
        pairs = list(zip(queues, caps, strict=True))
        plain = [(qn, c) for qn, c in pairs if (namespace, qn) not in keyed]
        rows: list[Any] = []
        if plain and any(c for _qn, c in plain):
            rows = await self._claim_rows(
                conn,
                namespace,
                [qn for qn, _ in plain],
                max_tasks,
                worker_id,
                now,
                [c for _, c in plain],
                budget,
            )
        used = sum(task_bytes(task_of(r)) for r in rows)
        left = abs(budget) - used
        if len(rows) >= max_tasks or (rows and left <= 0):
            return rows
        # Once a task is in the answer the rest must fit: strict (negative) from then on.
        rest = -left if rows or budget < 0 else left
        mine = [(qn, c) for qn, c in pairs if (namespace, qn) in keyed]
        names, mine_caps = [qn for qn, _ in mine], [c for _, c in mine]
        args = (namespace, names, mine_caps, worker_id, max_tasks - len(rows), now)
        try:
            got = await self._claim_keyed(conn, *args, rest)
        except POISON as exc:
            why = reason(f"its attempt counter is at its end, no claim can take it: {exc}")
            if not await conn.fetch(self._q("quarantine_unclaimable"), namespace, names, now, why):
                raise
            got = await self._claim_keyed(conn, *args, rest)
        return rows + got

    async def _claim_keyed(
        self,
        conn: Any,
        namespace: str,
        queues: list[str],
        caps: list[int],
        worker_id: str,
        max_tasks: int,
        now: datetime,
        max_bytes: int,
    ) -> list[Any]:
        return await key_claims.claim_keyed(
            conn,
            self.map_version,
            self.key_cursors,
            namespace,
            queues,
            caps,
            worker_id,
            max_tasks,
            now,
            self.lease_bounds_ms,
            max_bytes,
            TASK_FIXED_BYTES,
        )

    async def ready_heads(
        self,
        namespace: str,
        queues: Sequence[str],
        most: int,
        worker_id: str,
        *,
        keyed: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
        now: datetime | None = None,
    ) -> list[tuple[int, datetime, int]]:
        """The first ``most`` READY tasks of ``queues`` in claim order, read without locks:
        (priority, run_at, bytes in a claim's answer for ``worker_id``). Of a queue in
        ``keyed``, only the tasks a claim could start at ``now`` (``key_claims.key_heads``)."""
        if not queues or most < 1:
            return []
        mine = [qn for qn in queues if (namespace, qn) in keyed]
        plain = [qn for qn in queues if (namespace, qn) not in keyed]
        rows: list[Any] = []
        async with self.connection() as conn:
            if plain:
                rows += await conn.fetch(
                    q("ready_heads"), namespace, plain, most, worker_id, TASK_FIXED_BYTES
                )
            if mine:
                at = now if now is not None else datetime.now(UTC)
                rows += await key_claims.key_heads(
                    conn, self.key_cursors, namespace, mine, most, worker_id, at, TASK_FIXED_BYTES
                )
        heads = [(r["priority"], r["run_at"], r["bytes"]) for r in rows]
        if plain and mine:
            heads.sort(key=lambda h: (-h[0], h[1]))
        return heads[:most]

    async def _claim_rows(
        self,
        conn: Any,
        namespace: str,
        queues: Sequence[str],
        max_tasks: int,
        worker_id: str,
        now: datetime,
        caps: list[int],
        max_bytes: int,
    ) -> list[Any]:
        """The claim statement. Its lease arithmetic saturates, so only a READY row whose
        attempt counter is at its end (no next lease token fits) can fail it: such rows of
        the claimed queues are quarantined, and the claim runs once more for everyone else."""
        args = (
            namespace,
            list(queues),
            max_tasks,
            worker_id,
            now,
            caps,
            *self.lease_bounds_ms,
            max_bytes,
            TASK_FIXED_BYTES,
        )
        try:
            return list(await conn.fetch(self._q("claim"), *args))
        except POISON as exc:
            why = reason(f"its attempt counter is at its end, no claim can take it: {exc}")
            dead = await conn.fetch(
                self._q("quarantine_unclaimable"), namespace, list(queues), now, why
            )
            if not dead:
                raise
            log.warning(
                "quarantined %d unclaimable task(s) of %r: %s",
                len(dead),
                namespace,
                ", ".join(str(r["id"]) for r in dead),
            )
            return list(await conn.fetch(self._q("claim"), *args))

    async def heartbeat(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[HeartbeatOutcome]:
        """Extend the leases whose token is current; say why for the others."""
        ids, tokens = _lease_columns(leases)
        async with self.connection() as conn:
            ok = {
                str(r["id"])
                for r in await conn.fetch(
                    self._q("heartbeat"), namespace, ids, tokens, now, *self.lease_bounds_ms
                )
            }
            misses = await _explain_misses(conn, namespace, leases, ok)
        out = []
        for lease in leases:
            if lease.task_id in ok:
                out.append(HeartbeatOutcome(lease.task_id, ok=True))
            else:
                miss, why = misses[lease.task_id]
                out.append(
                    HeartbeatOutcome(
                        lease.task_id,
                        ok=False,
                        cancelled=miss is LeaseMiss.CANCELLED,
                        error=why,
                        reason=miss,
                    )
                )
        return out

    async def complete(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[AckOutcome]:
        """RUNNING → SUCCEEDED for each lease whose token is current.

        Safe to repeat: a lease whose attempt already completed the task (an ack sent again
        because its answer was lost, maybe through another node) is answered ok again.
        """
        ids, tokens = _lease_columns(leases)
        async with self.connection() as conn:
            done = await conn.fetch(self._q("complete"), namespace, ids, tokens, now)
            ok = {str(r["id"]) for r in done}
            # This ack freed a slot of its task's concurrency key: its queue.
            freed = {str(r["id"]): r["queue"] for r in done if r["keyed"]}
            # Read after the update, so a repeat that raced the first ack sees its commit.
            ok |= await _completed_by(conn, namespace, leases, ok)
            misses = await _explain_misses(conn, namespace, leases, ok)
        out = []
        for lease in leases:
            if lease.task_id in ok:
                out.append(AckOutcome(lease.task_id, True, freed=freed.get(lease.task_id)))
            else:
                miss, why = misses[lease.task_id]
                out.append(AckOutcome(lease.task_id, False, why, reason=miss))
        return out

    async def fail(
        self,
        namespace: str,
        lease: Lease,
        error: str,
        now: datetime,
        *,
        fatal: bool = False,
        retry_after: timedelta | None = None,
        rng: random.Random | None = None,
    ) -> Task:
        """RUNNING → SCHEDULED after a backoff (READY if due now), or DEAD if out of attempts."""
        task_id = parse_task_id(lease.task_id)
        async with self.connection() as conn, conn.transaction():
            row = await conn.fetchrow(self._q("lock_running"), task_id, namespace)
            _check_lease(row, lease, namespace)
            assert row is not None
            state, run_at = self.after_failure(
                row, now, fatal=fatal, retry_after=retry_after, rng=rng
            )
            rows = await conn.fetch(
                self._q("retry_running"),
                [task_id],
                [lease.lease_token],
                [int(state)],
                [run_at],
                [bucket_of(run_at, self.bucket_seconds)],
                [error[:MAX_ERROR_MESSAGE]],
                now,
            )
        return task_of(rows[0])

    async def release(self, namespace: str, lease: Lease) -> Task:
        """RUNNING → READY without using up an attempt (a worker stopping gracefully)."""
        async with self.connection() as conn:
            row = await conn.fetchrow(
                self._q("release"), parse_task_id(lease.task_id), namespace, lease.lease_token
            )
            if row is None:
                current = await conn.fetchrow(
                    q("get_task"), parse_task_id(lease.task_id), namespace
                )
                _check_lease(current, lease, namespace)
        assert row is not None
        return task_of(row)

    def after_failure(
        self,
        row: Any,
        now: datetime,
        *,
        fatal: bool = False,
        retry_after: timedelta | None = None,
        rng: random.Random | None = None,
    ) -> tuple[TaskState, datetime]:
        """Where a failed attempt of the stored ``row`` goes (``retry.after_failure``, with
        this store's horizon): DEAD, or back to waiting until a backoff time."""
        return retry_decision(
            row, now, horizon=self.horizon, fatal=fatal, retry_after=retry_after, rng=rng
        )
