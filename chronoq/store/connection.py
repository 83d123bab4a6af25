"""The store's connection to PostgreSQL: the pool, its liveness settings, and the one place
where driver and network errors become ``StoreUnavailable``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, Self

import asyncpg

from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS
from chronoq.errors import ConfigError, PartitionMoved, StoreUnavailable
from chronoq.limits import Limits
from chronoq.redact import mask_text
from chronoq.saturating import LONGEST, clamp, ms_of
from chronoq.store import password_guard
from chronoq.store.key_claims import KeyCursors
from chronoq.store.migrations import migrate
from chronoq.store.sql import q

# Every connection of the process refuses to send a password an impostor could read.
password_guard.install()

# The driver's and the network's ways of saying "PostgreSQL cannot answer now": an outage,
# not a bad statement.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,  # password, pg_hba, TLS
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,  # a connection left mid-protocol by a crash
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.OperatorInterventionError,  # admin/crash shutdown, cancelled query
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,  # see _LIVENESS
    # A write reached a server that is no longer (or not yet) the primary: after a failover,
    # behind a DNS name or a proxy that still points at the former primary.
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    TimeoutError,  # command_timeout: the server or the network stopped answering
)
# None of these tells whether a COMMIT in flight took effect (the server may have committed
# and died before answering): callers treat them as "outcome unknown", never as done, and
# repeat only what is safe to repeat (every transition is conditional, submits carry an
# idempotency key).
UNKNOWN_OUTCOME = "outcome unknown; safe to retry (a submit with its idempotency key)"


#: The SQLSTATE of chronoq_hold (migration 0011): a partition not held live here.
PARTITION_MOVED_SQLSTATE = "CQ001"


def _moved(exc: asyncpg.PostgresError) -> PartitionMoved:
    detail = getattr(exc, "detail", None) or ""
    parts = tuple(int(p) for p in detail.split(",") if p.strip().isdigit())
    return PartitionMoved(parts)


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except asyncpg.exceptions.UnknownPostgresError as exc:
        if getattr(exc, "sqlstate", None) == PARTITION_MOVED_SQLSTATE:
            raise _moved(exc) from exc
        raise
    except UNAVAILABLE as exc:
        raise StoreUnavailable(
            f"PostgreSQL unavailable: {type(exc).__name__}: {mask_text(str(exc))}; "
            f"{UNKNOWN_OUTCOME}"
        ) from exc


# Errors that say the server is no longer the primary (a dead one is dropped by the pool).
_MOVED = (asyncpg.exceptions.ReadOnlySQLTransactionError,)


class NotPrimary(StoreUnavailable):
    """The server is a standby (in recovery): it cannot take the store's writes."""


async def _require_primary(conn: Any) -> None:
    """A new pool connection must reach the primary. ``target_session_attrs=read-write`` in
    a multi-host DSN skips standbys already; this also covers a single host name that still
    points at a demoted primary, which would refuse every write as read-only."""
    if await conn.fetchval("SELECT pg_is_in_recovery()"):
        raise NotPrimary(f"PostgreSQL answered as a standby (in recovery); {UNKNOWN_OUTCOME}")


def _unconfirmed(message: Any) -> bool:
    """The notice PostgreSQL sends when a COMMIT stopped waiting for the synchronous standby
    (cancelled, or the session terminated): it committed locally but may not be replicated,
    so a failover can lose it, yet the COMMIT itself reports success."""
    return "synchronous replication" in str(getattr(message, "message", ""))


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


#: Every execution is planned with its arguments and the table as it is then: a queue's table
#: changes faster than its statistics, and a generic plan a connection cached while the table
#: was empty (a new cluster, or an ANALYZE after a drain) kept reading tasks by scans of the
#: whole table or of a namespace's rows once it held thousands: 400 ms statements at 5,000
#: due/s. Planning each call costs a little CPU; a wrong cached plan costs the tail.
_PLANS = {"plan_cache_mode": "force_custom_plan"}
# A listening connection sends nothing: keepalives and the server's connection check are
# what notice a lost one (no idle-transaction timeout: it never opens a transaction).
_LISTEN_LIVENESS = {k: v for k, v in _LIVENESS.items() if "transaction" not in k}
#: Seconds a pool waits for its busy connections when closing, before it terminates them.
CLOSE_TIMEOUT_S = 10
#: Seconds to open a listening connection, and to close one.
LISTEN_CONNECT_TIMEOUT_S = 10
LISTEN_CLOSE_TIMEOUT_S = 5


async def _no_reset(conn: Any) -> None:
    """The store leaves no session state behind (no LISTEN, cursors or held locks)."""


class Listener:
    """A listening connection; ``closed`` once it is lost (the caller opens a new one)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    @property
    def closed(self) -> bool:
        return self._conn.is_closed()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.close(), LISTEN_CLOSE_TIMEOUT_S)
        if not self._conn.is_closed():
            self._conn.terminate()


class Connected:
    """A pool on one PostgreSQL database and the settings every statement of the store uses;
    the base of the store's role classes."""

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
        # The shard map version the node routes by (a store of shards sets it): every write
        # of a partition passes it, and this shard refuses partitions it does not hold live
        # since a version <= it (shard_partitions, migration 0011).
        self.map_version: int = 1
        self.bucket_seconds = bucket_seconds
        self.dsn = dsn  # for connections outside the pool (listening for notices)
        # Stored durations are saturated at these bounds wherever they meet a time.
        self.limits = limits or Limits()
        self.horizon: timedelta = clamp(self.limits.horizon, timedelta(0), LONGEST)
        self.lease_bounds_ms = (
            ms_of(self.limits.min_lease_timeout),
            max(ms_of(self.limits.min_lease_timeout), ms_of(self.limits.max_lease_timeout)),
        )
        #: Where this store's walks over keyed queues' concurrency keys go on.
        self.key_cursors = KeyCursors()

    def _q(self, name: str) -> str:
        """The named write statement, checking this shard's holdings at ``map_version``."""
        return q(name, self.map_version)

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
        holds: Sequence[int] | None = None,
    ) -> Self:
        """Open a pool on ``dsn`` and, by default, apply pending migrations.

        Statements and new connections give up after ``command_timeout`` (then
        ``StoreUnavailable``), so a node cut off from PostgreSQL notices within seconds
        instead of hanging.

        ``holds``: the partitions this shard holds when its ``shard_partitions`` table has
        no row at all (``None``: every partition, which is how an existing single store
        becomes ``shard-0`` on its first connect after the upgrade; ``()``: a shard added
        later, which a move fills). A table with any row is left as it is.
        """
        with _translated():
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                command_timeout=command_timeout,
                # A connect gives up as soon (the driver's default waits 60 s): behind a cut
                # link a pool's new connection would otherwise hang a call for a minute.
                timeout=command_timeout,
                server_settings={
                    "application_name": "chronoq",
                    "timezone": "UTC",
                    **_LIVENESS,
                    **_PLANS,
                },
                reset=_no_reset,  # no session state to reset: saves a statement per call
                init=_require_primary,  # once per new connection, e.g. after a failover
            )
        store = cls(
            pool, partitions=partitions, bucket_seconds=bucket_seconds, limits=limits, dsn=dsn
        )
        if migrate:
            await store.migrate()
        await store.adopt(range(partitions) if holds is None else holds)
        return store

    async def holds_no_rows(self) -> bool:
        """Whether this database has no task (live or in its history) and no schedule yet (a
        first shard map may split only such a shard-0: an upgraded store keeps its partitions
        where its rows are)."""
        async with self.connection() as conn:
            found: bool = await conn.fetchval(
                "SELECT NOT EXISTS (SELECT 1 FROM tasks) AND NOT EXISTS (SELECT 1 FROM schedules)"
                " AND NOT EXISTS (SELECT 1 FROM task_history)"
            )
        return found

    async def adopt(self, holds: Iterable[int]) -> bool:
        """Record ``holds`` as live since map version 1 if this shard holds nothing yet (no
        row in ``shard_partitions``); returns whether it did. Concurrent callers serialise on
        the table's lock and only the first writes (idempotent, race-safe)."""
        wanted = sorted({int(p) for p in holds})
        for p in wanted:
            if not 0 <= p < self.partitions:
                raise ConfigError(
                    f"partition {p} is outside 0..{self.partitions - 1}: a shard holds only "
                    "partitions of the cluster's count"
                )
        async with self.connection() as conn:
            if await conn.fetchval("SELECT to_regclass('shard_partitions') IS NULL"):
                return False  # not migrated (migrate=False): nothing to fence yet
            if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM shard_partitions)"):
                return False
            async with conn.transaction():
                await conn.execute("LOCK TABLE shard_partitions IN SHARE ROW EXCLUSIVE MODE")
                status: str = await conn.execute(
                    "INSERT INTO shard_partitions (partition, state, since_version)"
                    " SELECT p, 0, 1 FROM unnest($1::smallint[]) AS p"
                    " WHERE NOT EXISTS (SELECT 1 FROM shard_partitions)",
                    wanted,
                )
        return status != "INSERT 0 0"

    async def migrate(self) -> list[int]:
        """Apply the migrations not yet applied, each in its own transaction; returns them."""
        async with self.connection() as conn:
            return await migrate(conn)

    async def close(self) -> None:
        """Close the pool; connections still busy after 10 s are terminated."""
        try:
            await asyncio.wait_for(self.pool.close(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            self.pool.terminate()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection whose driver and network errors come out as StoreUnavailable
        (every statement of the store and its companions goes through here)."""
        unconfirmed: list[Any] = []

        def notice(_conn: Any, message: Any) -> None:
            if _unconfirmed(message):
                unconfirmed.append(message)

        try:
            with _translated():
                async with self.pool.acquire() as conn:
                    conn.add_log_listener(notice)
                    try:
                        yield conn
                    finally:
                        # A connection lost mid-statement is already detached from its proxy.
                        with contextlib.suppress(asyncpg.exceptions.InterfaceError):
                            conn.remove_log_listener(notice)
        except StoreUnavailable as exc:
            if isinstance(exc, NotPrimary) or isinstance(exc.__cause__, _MOVED):
                # The primary moved: let every pooled connection go (each is replaced, and
                # checked by _require_primary, on its next acquire).
                await self.pool.expire_connections()
            raise
        if unconfirmed:
            # The notice is delivered before the COMMIT's reply wakes us up (both are queued
            # on the loop in order), so it is here by the time the block has ended.
            await self.pool.expire_connections()
            raise StoreUnavailable(
                f"PostgreSQL committed without the synchronous standby's confirmation "
                f"({unconfirmed[0].message}); {UNKNOWN_OUTCOME}"
            )

    async def probe(self, timeout: float = 2.0) -> bool:
        """Whether PostgreSQL answers a trivial query within ``timeout`` seconds."""
        try:
            async with self.connection() as conn:
                await conn.fetchval("SELECT 1", timeout=timeout)
        except StoreUnavailable:
            return False
        return True

    async def probe_any(self, timeout: float = 2.0) -> bool:
        """``probe``: one server is all of the store there is."""
        return await self.probe(timeout)

    @contextlib.asynccontextmanager
    async def server_clock(self) -> AsyncIterator[Callable[[], Awaitable[datetime]]]:
        """A reader of the server's clock (``clock_timestamp()``), on one pooled connection
        for as long as the block runs (a few readings, each timed by the caller)."""
        async with self.connection() as conn:

            async def read() -> datetime:
                reference: datetime = await conn.fetchval("SELECT clock_timestamp()")
                return reference

            yield read

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
                timeout=LISTEN_CONNECT_TIMEOUT_S,
                server_settings={"application_name": "chronoq-listen", **_LISTEN_LIVENESS},
            )
            try:
                await _require_primary(conn)  # notices of a standby's sessions never come
                await conn.add_listener(channel, lambda _c, _pid, _ch, payload: on_notice(payload))
            except BaseException:
                await conn.close()
                raise
        return Listener(conn)
