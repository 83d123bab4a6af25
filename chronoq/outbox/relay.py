"""The relay: moves committed outbox rows from the application's PostgreSQL to chronoq.

One pass (``relay_once``) is one transaction of the application's database:

1. lock the oldest rows of the namespace, ``FOR UPDATE SKIP LOCKED`` (another relay skips
   them and takes the next ones), at most ``batch_rows`` and ``batch_bytes`` of specs;
2. submit them in one ``SubmitBatch``, each keyed by its row id (or the caller's key);
3. delete them, in the transaction that locked them, only once the node acknowledged them.

A relay that dies after 2 and before 3 leaves the rows in place; the next pass submits them
again and the idempotency keys make the node answer the tasks it already has: never a second
task. A row the node refuses (INVALID_ARGUMENT) is moved to ``chronoq_outbox_failed`` with
the error, in the same transaction, and the rest of its batch goes on. While chronoq or the
database is unavailable the relay backs off (``chronoq.retry.backoff``) and keeps the rows.

A ``NOTIFY`` from each enqueue wakes the relay at once; it polls every ``poll_interval`` as
well, so a missed notice (a listener reconnecting) costs at most that delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from chronoq import errors
from chronoq.api.v1 import tasks_pb2
from chronoq.client import Client
from chronoq.errors import InvalidArgument
from chronoq.models import DEFAULT_NAMESPACE
from chronoq.outbox.connect import AppDatabaseUnavailable, connect
from chronoq.outbox.rows import spec_of
from chronoq.outbox.schema import CHANNEL, FAILED_TABLE, TABLE
from chronoq.retry import backoff

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("chronoq.outbox")

#: Rows per pass by default, and at most: well under a node's ``max_batch`` (10,000).
DEFAULT_BATCH_ROWS = 500
MAX_BATCH_ROWS = 5000
#: Bytes of specs per pass by default (one row more than this still goes alone), and at most:
#: a node's gRPC messages are 4 MiB unless configured otherwise.
DEFAULT_BATCH_BYTES = 1024 * 1024
MAX_BATCH_BYTES = 3 * 1024 * 1024
#: Characters of a node's refusal kept with a moved-aside row.
MAX_STORED_ERROR = 2000
#: Seconds between two lag lines in the log while rows keep moving.
LAG_LOG_EVERY_S = 10.0

_LOCK = (
    f"SELECT id, octet_length(spec) AS size FROM {TABLE} WHERE namespace = $1 "
    "ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED"
)
_READ = (
    "SELECT id, spec, extract(epoch FROM clock_timestamp() - created_at) AS age "
    f"FROM {TABLE} WHERE id = ANY($1::uuid[]) ORDER BY id"
)
_DELETE = f"DELETE FROM {TABLE} WHERE id = ANY($1::uuid[])"
_MOVE_ASIDE = (
    f"WITH gone AS (DELETE FROM {TABLE} WHERE id = $1 RETURNING *) "
    f"INSERT INTO {FAILED_TABLE} (id, namespace, queue, spec, created_at, error) "
    "SELECT id, namespace, queue, spec, created_at, $2 FROM gone"
)
_INDEX = re.compile(r"^(?:[A-Z_]+: )?tasks\[(\d+)\]")


@dataclass
class RelayStats:
    """What a relay has done since it started; ``lag_seconds``: the age of the oldest row of
    the last pass when it was read (time since its transaction began)."""

    moved: int = 0
    refused: int = 0
    passes: int = 0
    failures: int = 0  # passes that found chronoq or the database unavailable
    lag_seconds: float = 0.0
    max_lag_seconds: float = 0.0
    lags: list[float] = field(default_factory=list, repr=False)  # the last passes' lags


@dataclass(frozen=True)
class _Row:
    id: Any  # uuid.UUID
    spec: tasks_pb2.TaskSpec | None
    problem: str = ""  # why the spec could not be read


class Relay:
    """Moves ``namespace``'s outbox rows from ``dsn`` (the application's database) to the
    nodes of ``client``. ``await relay.run()`` until cancelled or ``stop()``; several relays
    may run on one table (they lock disjoint rows). Every database statement has
    ``db_timeout`` seconds and every submit ``submit_timeout``."""

    def __init__(
        self,
        dsn: str,
        client: Client,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        poll_interval: timedelta = timedelta(seconds=1),
        db_timeout: float = 10.0,
        submit_timeout: float = 10.0,
        backoff_initial: timedelta = timedelta(milliseconds=100),
        backoff_max: timedelta = timedelta(seconds=10),
    ) -> None:
        if not 1 <= batch_rows <= MAX_BATCH_ROWS:
            raise errors.ConfigError(f"batch_rows: must be within 1..{MAX_BATCH_ROWS}")
        if not 1 <= batch_bytes <= MAX_BATCH_BYTES:
            raise errors.ConfigError(f"batch_bytes: must be within 1..{MAX_BATCH_BYTES}")
        if poll_interval <= timedelta(0):
            raise errors.ConfigError("poll_interval: must be positive")
        self.dsn = dsn
        self.client = client
        self.namespace = namespace
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.poll_interval = poll_interval.total_seconds()
        self.db_timeout = db_timeout
        self.submit_timeout = submit_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stats = RelayStats()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._last_lag_log = 0.0

    def stop(self) -> None:
        """End ``run`` after its current pass (the pass commits or rolls back first)."""
        self._stopping.set()
        self._wake.set()

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Relay until ``stop()`` or cancellation."""
        conn: asyncpg.Connection | None = None
        listener: asyncpg.Connection | None = None
        failures = 0
        try:
            while not self._stopping.is_set():
                try:
                    if listener is None or listener.is_closed():
                        listener = await self._listen()
                    if conn is None or conn.is_closed():
                        conn = await connect(self.dsn, timeout=self.db_timeout)
                    moved = await self.relay_once(conn)
                    failures = 0
                except (errors.RemoteError, AppDatabaseUnavailable) as exc:
                    # Whatever the node answers but a refusal of a row (set aside in the pass),
                    # or the database failing: keep the rows and wait.
                    failures += 1
                    self.stats.failures += 1
                    pause = backoff(
                        failures, initial=self.backoff_initial, maximum=self.backoff_max
                    ).total_seconds()
                    log.warning("outbox relay: %s; retrying in %.1f s", exc.message, pause)
                    if isinstance(exc, AppDatabaseUnavailable):
                        await _closed(conn)
                        conn = None
                    await self._pause(pause)
                    continue
                if moved < self.batch_rows:  # the table is drained: wait for a notice
                    await self._sleep(self.poll_interval)
        finally:
            await _closed(conn)
            await _closed(listener)

    async def _listen(self) -> asyncpg.Connection:
        listener = await connect(self.dsn, timeout=self.db_timeout)
        try:
            await listener.add_listener(CHANNEL, self._notified)
        except Exception:
            await _closed(listener)
            raise
        self._wake.set()  # notices sent while nobody listened: look once
        return listener

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if payload == self.namespace:
            self._wake.set()

    async def _pause(self, seconds: float) -> None:
        """Until ``stop()`` or ``seconds``: a backoff that notices do not cut short (an
        application enqueueing fast would otherwise retry a node that is down at its pace)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _sleep(self, seconds: float) -> None:
        """Until a notice, ``stop()``, or ``seconds``."""
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass
        self._wake.clear()

    # ------------------------------------------------------------------ one pass

    async def relay_once(self, conn: asyncpg.Connection) -> int:
        """One transaction: lock a batch, submit it, delete what the node acknowledged and
        move aside what it refused. Answers how many rows it took off the table."""
        import asyncpg

        try:
            async with conn.transaction():
                rows, lag = await self._locked(conn)
                if not rows:
                    return 0
                accepted, refused = await self._submitted(rows)
                if accepted:
                    await self._delete(conn, accepted)
                for row_id, problem in refused:
                    await conn.execute(
                        _MOVE_ASIDE, row_id, problem[:MAX_STORED_ERROR], timeout=self.db_timeout
                    )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise AppDatabaseUnavailable(
                f"the application's database failed a relay pass: {exc}"
            ) from exc
        self._counted(len(accepted), refused, lag)
        return len(accepted) + len(refused)

    async def _locked(self, conn: asyncpg.Connection) -> tuple[list[_Row], float]:
        locked = await conn.fetch(_LOCK, self.namespace, self.batch_rows, timeout=self.db_timeout)
        ids: list[Any] = []
        total = 0
        for r in locked:
            if ids and total + r["size"] > self.batch_bytes:
                break  # the rest stay locked until this commit, then go next pass
            ids.append(r["id"])
            total += r["size"]
        if not ids:
            return [], 0.0
        read = await conn.fetch(_READ, ids, timeout=self.db_timeout)
        rows = []
        for r in read:
            try:
                spec = spec_of(r["spec"])
                spec.namespace = self.namespace
                rows.append(_Row(r["id"], spec))
            except InvalidArgument as exc:
                rows.append(_Row(r["id"], None, exc.message))
        return rows, float(read[0]["age"]) if read else 0.0

    async def _delete(self, conn: asyncpg.Connection, ids: Sequence[Any]) -> None:
        """Take acknowledged rows off the table (a separate step so a test can fail it)."""
        await conn.execute(_DELETE, list(ids), timeout=self.db_timeout)

    async def _submitted(self, rows: Sequence[_Row]) -> tuple[list[Any], list[tuple[Any, str]]]:
        """Submit ``rows``; (ids acknowledged, (id, refusal) of those the node refused).
        A refusal of the whole batch names the task it is about (``tasks[i].field``): that
        row is set aside and the others sent again; one that names none splits the batch."""
        refused = [(r.id, r.problem) for r in rows if r.spec is None]
        pending = [r for r in rows if r.spec is not None]
        accepted: list[Any] = []
        # Each refusal removes a row or splits a part: at most 2 * len(rows) calls.
        parts = [pending] if pending else []
        while parts:
            part = parts.pop()
            try:
                await self.send([r.spec for r in part if r.spec is not None])
            except errors.BadRequest as exc:
                index = _refused_index(exc.message, len(part))
                if len(part) == 1:
                    refused.append((part[0].id, exc.message))
                elif index is not None:
                    refused.append((part[index].id, exc.message))
                    rest = part[:index] + part[index + 1 :]
                    if rest:
                        parts.append(rest)
                else:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]
                continue
            accepted += [r.id for r in part]
        return accepted, refused

    async def send(self, specs: Sequence[tasks_pb2.TaskSpec]) -> None:
        """One ``SubmitBatch`` of ``specs`` within ``submit_timeout``; raises the node's
        refusal. Safe to repeat: every spec carries its idempotency key."""
        request = tasks_pb2.SubmitBatchRequest(tasks=list(specs), ids_only=True)
        await self.client._call(
            lambda n: n.tasks.SubmitBatch, request, timeout=self.submit_timeout, retry=True
        )

    def _counted(self, accepted: int, refused: list[tuple[Any, str]], lag: float) -> None:
        s = self.stats
        s.passes += 1
        s.moved += accepted
        s.refused += len(refused)
        s.lag_seconds = lag
        s.max_lag_seconds = max(s.max_lag_seconds, lag)
        s.lags.append(lag)
        del s.lags[:-1000]
        for row_id, problem in refused:
            log.error("outbox row %s refused, moved to %s: %s", row_id, FAILED_TABLE, problem)
        now = time.monotonic()
        if now - self._last_lag_log >= LAG_LOG_EVERY_S:
            self._last_lag_log = now
            log.info(
                "outbox relay: %d rows moved, %d refused; oldest row of the last pass %.3f s old",
                s.moved,
                s.refused,
                lag,
            )


def _refused_index(message: str, count: int) -> int | None:
    match = _INDEX.match(message)
    if match is None:
        return None
    index = int(match.group(1))
    return index if index < count else None


async def _closed(conn: asyncpg.Connection | None) -> None:
    import asyncpg

    if conn is not None and not conn.is_closed():
        try:
            await conn.close(timeout=2)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn.terminate()  # a broken connection's close: end it the hard way
