"""All database work of chronoq: one class, named queries, conditional updates.

Driver errors become ``StoreUnavailable`` here and nowhere else. Every owner statement
(fire, reap, watermark) carries the partition's fencing token and does nothing when the
stored token is no longer the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg

from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS, bucket_of, partition_of
from chronoq.errors import (
    InvalidArgument,
    InvalidTransition,
    NamespaceCapReached,
    StaleLease,
    StoreUnavailable,
    TaskNotFound,
)
from chronoq.models import (
    AckOutcome,
    HeartbeatOutcome,
    Lease,
    Limits,
    MisfirePolicy,
    Page,
    SubmitOutcome,
    Task,
    TaskSpec,
    TaskState,
)
from chronoq.retry import attempts_left, retry_time, stored_backoff
from chronoq.saturating import LONGEST, clamp, ms_of, ms_to_delta
from chronoq.store.quarantine import POISON, QUARANTINED, isolate, reason
from chronoq.store.sql import migrations, q
from chronoq.timeslice import Timeslice, converted

log = logging.getLogger("chronoq.store")

_MS = timedelta(milliseconds=1)
_ZERO_UUID = uuid.UUID(int=0)
_MIGRATION_LOCK = 0x6368726F6E6F71  # "chronoq": one migrator at a time
#: Bytes a page of a listing holds at most (unless one task alone is larger): it fits in the
#: 4 MiB a gRPC client accepts by default, and eight concurrent listings of 256 KiB payloads
#: hold tens of megabytes on a node, not gigabytes.
PAGE_BYTES = 3 * 1024 * 1024
#: What a listed task costs besides its strings: ids, times, numbers and framing.
ROW_BYTES = 256
#: Specs turned into insert columns between two yields to the event loop (a few ms).
COLUMN_SLICE = 200


@dataclass(frozen=True)
class Fence:
    """A partition's current fencing token and firing watermark."""

    partition: int
    token: int
    watermark: int
    owner: str = ""
    cluster_id: str = ""


@dataclass
class FireResult:
    """What one firing statement did."""

    fired: int = 0
    skipped: int = 0
    ready_by_queue: Counter[tuple[str, str]] = field(default_factory=Counter)
    per_partition: Counter[int] = field(default_factory=Counter)
    lateness: list[float] = field(default_factory=list)  # seconds, of each fired task
    quarantined: list[Task] = field(default_factory=list)  # due rows set aside as DEAD
    # Partitions where a namespace filled its share of the batch (or more namespaces had due
    # rows than the batch has rows): they may have more due rows.
    unfinished: set[int] = field(default_factory=set)

    def saturated(self) -> set[int]:
        """Partitions that may have more due rows: worth another statement this tick."""
        return self.unfinished | {t.partition for t in self.quarantined}


@contextlib.contextmanager
def _translated() -> Any:
    try:
        yield
    except (
        OSError,
        asyncpg.exceptions.PostgresConnectionError,
        asyncpg.exceptions.InvalidAuthorizationSpecificationError,  # password, pg_hba, TLS
        asyncpg.exceptions.InterfaceError,
        asyncpg.exceptions.InternalClientError,  # a connection left mid-protocol by a crash
        asyncpg.exceptions.CannotConnectNowError,
        asyncpg.exceptions.OperatorInterventionError,  # admin/crash shutdown, cancelled query
        asyncpg.exceptions.InsufficientResourcesError,  # too many connections
        asyncpg.exceptions.IdleInTransactionSessionTimeoutError,  # see _LIVENESS
        TimeoutError,  # command_timeout: the server or the network stopped answering
    ) as exc:
        raise StoreUnavailable(f"PostgreSQL unavailable: {type(exc).__name__}: {exc}") from exc


# The server notices a vanished client (a node cut off or killed) within seconds and ends
# its transaction, so the fence locks of an in-flight owner statement do not outlive it.
# Keepalives cover a dead peer; a peer that is alive but silent (a node cut off between the
# statement and the COMMIT of a reap, behind a proxy or a partition) holds its FOR SHARE
# locks on the fences until the idle-in-transaction timeout, and the successor's fence write
# waits that long: keep it under the time a successor needs to take over (0.6 x lease TTL).
# chronoq never idles in a transaction beyond a few ms of Python between two statements.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 1000
_LIVENESS = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "client_connection_check_interval": "2000",
    "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
}


# A listening connection sends nothing: keepalives and the server's connection check are
# what notice a lost one (no idle-transaction timeout: it never opens a transaction).
_LISTEN_LIVENESS = {k: v for k, v in _LIVENESS.items() if "transaction" not in k}


async def _no_reset(conn: Any) -> None:
    """The store leaves no session state behind (no LISTEN, cursors or held locks)."""


def parse_task_id(task_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(task_id)
    except (ValueError, AttributeError, TypeError):
        raise InvalidArgument("id", f"{task_id!r} is not a task id (a UUID)") from None


def _ms(d: timedelta) -> int:
    return d // _MS


E = TypeVar("E", bound=enum.IntEnum)
_UNKNOWN_SEEN: set[str] = set()  # task ids whose unknown state was logged already
_UNKNOWN_LOGGED = 1000


def known(kind: type[E], value: Any, fallback: E) -> E:
    """``kind(value)``, or ``fallback`` for a value no version of chronoq writes."""
    try:
        return kind(value)
    except (ValueError, TypeError):
        return fallback


def _task(row: Any) -> Task:
    """A stored row as a ``Task``; never fails on values no version writes, so one bad row
    cannot fail a page, a claim or a reap for the others.

    A state no version knows reads as DEAD (no statement picks the row up again, and a
    requeue takes it like any dead task), with ``last_error`` saying so; a misfire policy no
    version knows reads as FIRE_LATE (what firing does with it); durations are saturated
    into ``[0, LONGEST]``. Instants are clamped to what the driver decodes by the queries.
    """
    state = known(TaskState, row["state"], TaskState.DEAD)
    last_error = row["last_error"]
    if state.value != row["state"]:
        last_error = f"{QUARANTINED}stored state {row['state']} is unknown; reads as DEAD"
        task_id = str(row["id"])
        if task_id not in _UNKNOWN_SEEN and len(_UNKNOWN_SEEN) < _UNKNOWN_LOGGED:
            _UNKNOWN_SEEN.add(task_id)
            log.warning("task %s has unknown state %r; read as DEAD", task_id, row["state"])
    return Task(
        id=str(row["id"]),
        namespace=row["namespace"],
        queue=row["queue"],
        state=state,
        run_at=row["run_at"],
        partition=row["partition"],
        bucket=row["bucket"],
        payload=bytes(row["payload"]),
        idempotency_key=row["idempotency_key"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        retry_base=row["retry_base"],
        priority=row["priority"],
        backoff_initial=ms_to_delta(row["backoff_initial_ms"]),
        backoff_max=ms_to_delta(row["backoff_max_ms"]),
        lease_timeout=ms_to_delta(row["lease_timeout_ms"]),
        misfire_policy=known(MisfirePolicy, row["misfire_policy"], MisfirePolicy.FIRE_LATE),
        misfire_grace=ms_to_delta(row["misfire_grace_ms"]),
        lease_until=row["lease_until"],
        worker_id=row["worker_id"],
        last_error=last_error,
        created_at=row["created_at"],
        fired_at=row["fired_at"],
        finished_at=row["finished_at"],
        fired_by=row.get("fired_by"),
        fire_token=row.get("fire_token"),
    )


class Store:
    """The task store on one PostgreSQL database (a pool of connections)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        bucket_seconds: int = DEFAULT_BUCKET_SECONDS,
        limits: Limits | None = None,
        dsn: str | None = None,
    ) -> None:
        self.pool = pool
        self.partitions = partitions
        self.bucket_seconds = bucket_seconds
        self.dsn = dsn  # for connections outside the pool (listening for notices)
        # Stored durations are saturated at these bounds wherever they meet a time.
        self.limits = limits or Limits()
        self.horizon = clamp(self.limits.horizon, timedelta(0), LONGEST)
        self.lease_bounds_ms = (
            ms_of(self.limits.min_lease_timeout),
            max(ms_of(self.limits.min_lease_timeout), ms_of(self.limits.max_lease_timeout)),
        )

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        bucket_seconds: int = DEFAULT_BUCKET_SECONDS,
        min_size: int = 2,
        max_size: int = 10,
        migrate: bool = True,
        command_timeout: float = 15.0,
        limits: Limits | None = None,
    ) -> Store:
        """Open a pool on ``dsn`` and, by default, apply pending migrations.

        Statements give up after ``command_timeout`` (then ``StoreUnavailable``), so a node
        cut off from PostgreSQL notices within seconds instead of hanging.
        """
        with _translated():
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                command_timeout=command_timeout,
                server_settings={"application_name": "chronoq", "timezone": "UTC", **_LIVENESS},
                reset=_no_reset,  # no session state to reset: saves a statement per call
            )
        store = cls(
            pool, partitions=partitions, bucket_seconds=bucket_seconds, limits=limits, dsn=dsn
        )
        if migrate:
            await store.migrate()
        return store

    async def close(self) -> None:
        """Close the pool; connections still busy after 10 s are terminated."""
        try:
            await asyncio.wait_for(self.pool.close(), 10)
        except TimeoutError:
            self.pool.terminate()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection whose driver and network errors come out as StoreUnavailable
        (every statement of the store and its companions goes through here)."""
        with _translated():
            async with self.pool.acquire() as conn:
                yield conn

    async def migrate(self) -> list[int]:
        """Apply the migrations not yet applied, each in its own transaction; returns them."""
        applied: list[int] = []
        async with self.connection() as conn:
            await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
            try:
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                done = {
                    r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")
                }
                for version, name, sql in migrations():
                    if version in done:
                        continue
                    async with conn.transaction():
                        await conn.execute(sql)
                        await conn.execute(
                            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                            version,
                            name,
                        )
                    applied.append(version)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
        return applied

    # ---------------------------------------------------------------- client API

    def _insert_columns(
        self, specs: Sequence[TaskSpec], now: datetime
    ) -> tuple[list[uuid.UUID], list[list[Any]]]:
        """New ids and the column arrays of ``insert_task_ids``; due tasks start READY."""
        raw = os.urandom(16 * len(specs))  # one syscall for the whole batch
        ids = [uuid.UUID(bytes=raw[i : i + 16], version=4) for i in range(0, len(raw), 16)]
        cols: list[list[Any]] = [[] for _ in range(16)]
        ready, scheduled = int(TaskState.READY), int(TaskState.SCHEDULED)
        for task_id, s in zip(ids, specs, strict=True):
            row = (
                task_id,
                s.namespace,
                s.queue,
                partition_of(task_id.bytes, self.partitions),
                bucket_of(s.run_at, self.bucket_seconds),
                s.run_at,
                ready if s.run_at <= now else scheduled,
                s.priority,
                s.payload,
                s.idempotency_key,
                s.max_attempts,
                _ms(s.backoff_initial),
                _ms(s.backoff_max),
                _ms(s.lease_timeout),
                int(s.misfire_policy),
                _ms(s.misfire_grace),
            )
            for col, value in zip(cols, row, strict=True):
                col.append(value)
        return ids, cols

    async def _insert_columns_sliced(
        self, specs: Sequence[TaskSpec], now: datetime
    ) -> tuple[list[uuid.UUID], list[list[Any]]]:
        """``_insert_columns`` a slice at a time, yielding between slices: a full batch takes
        a tenth of a second, which the event loop must not spend in one go."""
        ids: list[uuid.UUID] = []
        cols: list[list[Any]] = []
        timeslice = Timeslice()
        for start in range(0, len(specs), COLUMN_SLICE):
            part_ids, part_cols = self._insert_columns(specs[start : start + COLUMN_SLICE], now)
            ids += part_ids
            if not cols:
                cols = part_cols
            else:
                for col, part in zip(cols, part_cols, strict=True):
                    col.extend(part)
            await timeslice.pause_if_due()
        return ids, cols

    @staticmethod
    def _conflicting_keys(
        ids: Sequence[uuid.UUID], specs: Sequence[TaskSpec], inserted: set[uuid.UUID]
    ) -> dict[str, list[str]]:
        missing: dict[str, list[str]] = {}
        for task_id, s in zip(ids, specs, strict=True):
            if task_id not in inserted and s.idempotency_key is not None:
                missing.setdefault(s.namespace, []).append(s.idempotency_key)
        return missing

    async def submit(self, specs: Sequence[TaskSpec], now: datetime) -> list[SubmitOutcome]:
        """Insert tasks durably; a repeated (namespace, idempotency_key) returns the first task.

        A task already due at ``now`` goes straight to READY; the rest wait in their bucket.
        """
        accepted = await self.submit_ids(specs, now)
        async with self.connection() as conn:
            rows = await conn.fetch(q("tasks_by_id"), [uuid.UUID(i) for i, _c in accepted])
        by_id = {t.id: t for t in await converted(rows, _task)}
        return [SubmitOutcome(by_id[i], created) for i, created in accepted]

    async def submit_ids(self, specs: Sequence[TaskSpec], now: datetime) -> list[tuple[str, bool]]:
        """``submit`` that answers only (task id, created) per spec: no rows sent back."""
        if not specs:
            return []
        ids, cols = await self._insert_columns_sliced(specs, now)
        async with self.connection() as conn:
            inserted = {r["id"] for r in await conn.fetch(q("insert_task_ids"), *cols, now)}
            existing: dict[tuple[str, str], uuid.UUID] = {}
            for ns, keys in self._conflicting_keys(ids, specs, inserted).items():
                for r in await conn.fetch(q("task_ids_by_idempotency_key"), ns, keys):
                    existing[(ns, r["idempotency_key"])] = r["id"]
        out = []
        for task_id, s in zip(ids, specs, strict=True):
            if task_id in inserted:
                out.append((str(task_id), True))
            else:
                assert s.idempotency_key is not None
                out.append((str(existing[(s.namespace, s.idempotency_key)]), False))
        return out

    async def get(self, task_id: str, namespace: str) -> Task:
        async with self.connection() as conn:
            row = await conn.fetchrow(q("get_task"), parse_task_id(task_id), namespace)
        if row is None:
            raise TaskNotFound(task_id, namespace)
        return _task(row)

    async def cancel(self, task_id: str, namespace: str, now: datetime) -> Task:
        """SCHEDULED, READY or RUNNING → CANCELLED. A running worker learns it by heartbeat."""
        async with self.connection() as conn:
            row = await conn.fetchrow(q("cancel"), parse_task_id(task_id), namespace, now)
        if row is not None:
            return _task(row)
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
    ) -> Page:
        """A page of tasks ordered by id; pass ``next_token`` back for the next page.

        The page ends early rather than pass ``max_bytes`` (it always holds one task), so a page
        of large payloads costs the node megabytes, not ``page_size`` times the payload limit."""
        if not 1 <= page_size <= 1000:
            raise InvalidArgument("page_size", "must be between 1 and 1000")
        after = _ZERO_UUID
        if page_token:
            try:
                after = uuid.UUID(page_token)
            except ValueError:
                raise InvalidArgument("page_token", "is not a token from a previous page") from None
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
        tasks = await converted(rows, _task)
        candidates = rows[0]["page_rows"] if rows else 0
        more = candidates == page_size or len(rows) < candidates
        return Page(tasks, tasks[-1].id if more else "")

    async def announce(self, channel: str, payloads: Sequence[str]) -> None:
        """NOTIFY ``channel`` once per payload, in one statement."""
        if payloads:
            async with self.connection() as conn:
                await conn.execute(q("announce"), channel, list(payloads))

    async def listen(self, channel: str, on_notice: Callable[[str], None]) -> Listener:
        """A connection of its own (outside the pool) that LISTENs on ``channel`` and passes
        each notice's payload to ``on_notice``."""
        if self.dsn is None:
            raise StoreUnavailable("no DSN to open a listening connection with")
        with _translated():
            conn = await asyncpg.connect(
                self.dsn,
                timeout=10,
                server_settings={"application_name": "chronoq-listen", **_LISTEN_LIVENESS},
            )
            try:
                await conn.add_listener(channel, lambda _c, _pid, _ch, payload: on_notice(payload))
            except BaseException:
                await conn.close()
                raise
        return Listener(conn)

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

    async def requeue(self, namespace: str, ids: Sequence[str], now: datetime) -> list[Task]:
        """DEAD → READY now, with a fresh attempt budget. All or none."""
        if not ids:
            raise InvalidArgument("ids", "name at least one dead task")
        parsed = [parse_task_id(i) for i in ids]
        async with self.connection() as conn, conn.transaction():
            rows = await conn.fetch(
                q("requeue_dead"), parsed, namespace, now, bucket_of(now, self.bucket_seconds)
            )
            if len(rows) != len(set(parsed)):
                done = {str(r["id"]) for r in rows}
                bad = next(i for i in ids if str(parse_task_id(i)) not in done)
                raise _Abort(bad)
        return [_task(r) for r in rows]

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
    ) -> list[Task]:
        """READY → RUNNING for up to ``max_tasks``; each gets attempt + 1 as its lease token.

        Queues in ``limited`` have a cluster-wide dispatch limit: tokens are taken from their
        bucket first, and the ones a claim did not use are given back.
        """
        async with self.connection() as conn:
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
            rows = await self._claim_rows(conn, namespace, queues, max_tasks, worker_id, now, caps)
            for queue, cap in zip(queues, caps, strict=True):
                if (namespace, queue) in limited:
                    used = sum(1 for r in rows if r["queue"] == queue)
                    if cap > used:
                        await conn.execute(q("return_tokens"), namespace, queue, cap - used)
        tasks = await converted(rows, _task)
        tasks.sort(key=lambda t: (-t.priority, t.run_at))
        return tasks

    async def _claim_rows(
        self,
        conn: Any,
        namespace: str,
        queues: Sequence[str],
        max_tasks: int,
        worker_id: str,
        now: datetime,
        caps: list[int],
    ) -> list[Any]:
        """The claim statement. Its lease arithmetic saturates, so only a READY row whose
        attempt counter is at its end (no next lease token fits) can fail it: such rows of
        the claimed queues are quarantined, and the claim runs once more for everyone else."""
        args = (namespace, list(queues), max_tasks, worker_id, now, caps, *self.lease_bounds_ms)
        try:
            return list(await conn.fetch(q("claim"), *args))
        except POISON as exc:
            why = reason(f"its attempt counter is at its end, no claim can take it: {exc}")
            dead = await conn.fetch(q("quarantine_unclaimable"), namespace, list(queues), now, why)
            if not dead:
                raise
            log.warning(
                "quarantined %d unclaimable task(s) of %r: %s",
                len(dead),
                namespace,
                ", ".join(str(r["id"]) for r in dead),
            )
            return list(await conn.fetch(q("claim"), *args))

    async def heartbeat(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[HeartbeatOutcome]:
        """Extend the leases whose token is current; say why for the others."""
        ids, tokens = self._lease_columns(leases)
        async with self.connection() as conn:
            ok = {
                str(r["id"])
                for r in await conn.fetch(
                    q("heartbeat"), namespace, ids, tokens, now, *self.lease_bounds_ms
                )
            }
            misses = await self._explain_misses(conn, namespace, leases, ok)
        out = []
        for lease in leases:
            if lease.task_id in ok:
                out.append(HeartbeatOutcome(lease.task_id, ok=True))
            else:
                cancelled, why = misses[lease.task_id]
                out.append(
                    HeartbeatOutcome(lease.task_id, ok=False, cancelled=cancelled, error=why)
                )
        return out

    async def complete(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[AckOutcome]:
        """RUNNING → SUCCEEDED for each lease whose token is current.

        Safe to repeat: a lease whose attempt already completed the task (an ack sent again
        because its answer was lost, maybe through another node) is answered ok again.
        """
        ids, tokens = self._lease_columns(leases)
        async with self.connection() as conn:
            ok = {
                str(r["id"]) for r in await conn.fetch(q("complete"), namespace, ids, tokens, now)
            }
            # Read after the update, so a repeat that raced the first ack sees its commit.
            ok |= await self._completed_by(conn, namespace, leases, ok)
            misses = await self._explain_misses(conn, namespace, leases, ok)
        return [
            AckOutcome(lease.task_id, True)
            if lease.task_id in ok
            else AckOutcome(lease.task_id, False, misses[lease.task_id][1])
            for lease in leases
        ]

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
            row = await conn.fetchrow(q("lock_running"), task_id, namespace)
            self._check_lease(row, lease, namespace)
            assert row is not None
            state, run_at = self.after_failure(
                row, now, fatal=fatal, retry_after=retry_after, rng=rng
            )
            rows = await conn.fetch(
                q("retry_running"),
                [task_id],
                [lease.lease_token],
                [int(state)],
                [run_at],
                [bucket_of(run_at, self.bucket_seconds)],
                [error[:4000]],
                now,
            )
        return _task(rows[0])

    async def release(self, namespace: str, lease: Lease) -> Task:
        """RUNNING → READY without using up an attempt (a worker stopping gracefully)."""
        async with self.connection() as conn:
            row = await conn.fetchrow(
                q("release"), parse_task_id(lease.task_id), namespace, lease.lease_token
            )
            if row is None:
                current = await conn.fetchrow(
                    q("get_task"), parse_task_id(lease.task_id), namespace
                )
                self._check_lease(current, lease, namespace)
        assert row is not None
        return _task(row)

    def after_failure(
        self,
        row: Any,
        now: datetime,
        *,
        fatal: bool = False,
        retry_after: timedelta | None = None,
        rng: random.Random | None = None,
    ) -> tuple[TaskState, datetime]:
        """Where a failed attempt goes: DEAD, or back to waiting until a backoff time.

        The delay saturates at the horizon whatever the row holds (a backoff of 2**63 ms
        from an older version retries a horizon from now instead of raising OverflowError).
        """
        if fatal or not attempts_left(row["attempt"], row["max_attempts"], row["retry_base"]):
            return TaskState.DEAD, now
        delay = (
            retry_after
            if retry_after is not None
            else stored_backoff(
                row["attempt"] - row["retry_base"],
                row["backoff_initial_ms"],
                row["backoff_max_ms"],
                horizon=self.horizon,
                rng=rng,
            )
        )
        run_at = retry_time(now, delay, horizon=self.horizon)
        return (TaskState.READY if run_at <= now else TaskState.SCHEDULED), run_at

    @staticmethod
    def _lease_columns(leases: Sequence[Lease]) -> tuple[list[uuid.UUID], list[int]]:
        return [parse_task_id(lease.task_id) for lease in leases], [
            lease.lease_token for lease in leases
        ]

    @staticmethod
    async def _completed_by(
        conn: asyncpg.Connection, namespace: str, leases: Sequence[Lease], ok: set[str]
    ) -> set[str]:
        """The tasks among the misses that are SUCCEEDED by the very attempt of their lease."""
        missed = [lease for lease in leases if lease.task_id not in ok]
        if not missed:
            return set()
        ids, tokens = Store._lease_columns(missed)
        rows = await conn.fetch(q("completed_by"), namespace, ids, tokens)
        return {str(r["id"]) for r in rows}

    @staticmethod
    async def _explain_misses(
        conn: asyncpg.Connection, namespace: str, leases: Sequence[Lease], ok: set[str]
    ) -> dict[str, tuple[bool, str]]:
        missed = [lease for lease in leases if lease.task_id not in ok]
        if not missed:
            return {}
        rows = await conn.fetch(
            q("lease_states"), namespace, [parse_task_id(m.task_id) for m in missed]
        )
        found = {str(r["id"]): r for r in rows}
        out: dict[str, tuple[bool, str]] = {}
        for m in missed:
            r = found.get(m.task_id)
            if r is None:
                out[m.task_id] = (False, f"no task {m.task_id} in namespace {namespace!r}")
                continue
            state = known(TaskState, r["state"], TaskState.DEAD)
            if state is TaskState.CANCELLED:
                out[m.task_id] = (True, "the task was cancelled")
            elif state is not TaskState.RUNNING:
                out[m.task_id] = (False, f"the task is {state.name}, not RUNNING")
            else:
                out[m.task_id] = (
                    False,
                    f"lease token {m.lease_token} is stale; the current attempt is {r['attempt']}",
                )
        return out

    @staticmethod
    def _check_lease(row: Any, lease: Lease, namespace: str) -> None:
        if row is None:
            raise TaskNotFound(lease.task_id, namespace)
        state = known(TaskState, row["state"], TaskState.DEAD)
        if state is not TaskState.RUNNING:
            raise StaleLease(
                lease.task_id, lease.lease_token, f"the task is {state.name}, not RUNNING"
            )
        if row["attempt"] != lease.lease_token:
            raise StaleLease(
                lease.task_id, lease.lease_token, f"the current attempt is {row['attempt']}"
            )

    # ---------------------------------------------------------------- owners

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
                        q("fire_due"), parts, tokens, bucket, now, batch, node_id, horizon_ms
                    )
                )
            except POISON:
                due = await conn.fetch(q("due_task_ids"), parts, tokens, bucket, now, batch)
                result.unfinished.update(r["partition"] for r in due if r["more"])
                rows = []

                async def fire(ids: Sequence[Any]) -> None:
                    fired = await conn.fetch(
                        q("fire_ids"), parts, tokens, bucket, now, list(ids), node_id, horizon_ms
                    )
                    rows.extend(fired)

                async def poisoned(task_id: Any, exc: BaseException) -> None:
                    result.quarantined.extend(
                        await self._quarantine(conn, owned, now, task_id, TaskState.SCHEDULED, exc)
                    )

                await isolate([r["id"] for r in due], fire, poisoned)
        for task in result.quarantined:
            result.per_partition[task.partition] += 1
        for r in rows:
            result.per_partition[r["partition"]] += 1
            if r.get("more"):
                result.unfinished.add(r["partition"])
            if r["state"] == TaskState.SKIPPED:
                result.skipped += 1
            else:
                result.fired += 1
                result.ready_by_queue[(r["namespace"], r["queue"])] += 1
                result.lateness.append(r["lateness"])
        return result

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
        rows = await conn.fetch(q("quarantine_tasks"), *fences, [task_id], now, int(expected), why)
        tasks = [_task(r) for r in rows]
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
            rows = await conn.fetch(q("expired_leases"), *fences, now, batch, ms_of(self.horizon))

            async def retry(chunk: Sequence[Any]) -> None:
                async with conn.transaction():  # a savepoint: a failed try leaves nothing
                    cols = self._retry_columns(chunk, now, rng)
                    tasks = [_task(r) for r in await conn.fetch(q("retry_running"), *cols, now)]
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
            state, run_at = self.after_failure(r, now, rng=rng)
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

    async def pending_by_bucket(
        self, partitions: Sequence[int], first: int, last: int
    ) -> dict[tuple[int, int], int]:
        """Pending (SCHEDULED) tasks per (partition, bucket) over ``first..last``."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("pending_by_bucket"), list(partitions), first, last)
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
                q("purge_finished"), list(partitions), [int(s) for s in states], before, batch
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

    async def queue_limits(self) -> dict[tuple[str, str], tuple[float, float]]:
        async with self.connection() as conn:
            rows = await conn.fetch(q("queue_limits"))
        return {(r["namespace"], r["queue"]): (r["rate"], r["burst"]) for r in rows}

    async def probe(self, timeout: float = 2.0) -> bool:
        """Whether PostgreSQL answers a trivial query within ``timeout`` seconds."""
        try:
            async with self.connection() as conn:
                await conn.fetchval("SELECT 1", timeout=timeout)
        except StoreUnavailable:
            return False
        return True

    async def count_by_state(self) -> dict[TaskState, int]:
        """Exact counts per state: a full scan, for tests, demos and small tables only."""
        async with self.connection() as conn:
            rows = await conn.fetch(q("count_by_state"))
        counts: Counter[TaskState] = Counter()
        for r in rows:  # a state no version knows counts as DEAD, as a task reads
            counts[known(TaskState, r["state"], TaskState.DEAD)] += r["n"]
        return dict(counts)


class Listener:
    """A listening connection; ``closed`` once it is lost (the caller opens a new one)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    @property
    def closed(self) -> bool:
        return self._conn.is_closed()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.close(), 5)
        if not self._conn.is_closed():
            self._conn.terminate()


class _Abort(InvalidArgument):
    def __init__(self, task_id: str) -> None:
        super().__init__(
            "ids", f"task {task_id} is not DEAD (or does not exist); nothing was requeued"
        )
