"""PostgreSQL without chronoq in between: fresh databases, COPY loads and the raw ceilings.

The ceilings run the very statements chronoq runs (``chronoq.store.sql.q``: ``insert_task_ids``,
``fire_due``, ``claim``, ``complete``) through asyncpg in tight loops, with no gRPC, no node and
no per-row Python work, on the same server and in the same run as the chronoq figures. On a
shared, noisy machine only such same-run ratios mean much (see PERFORMANCE.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS, bucket_of
from chronoq.diagnostics.task_rows import NAMESPACE, QUEUE, copy_rows, task_rows
from chronoq.limits import MAX_ANSWER_BYTES, TASK_FIXED_BYTES, Limits
from chronoq.store import Store
from chronoq.store.sql import q


class BenchError(RuntimeError):
    """A benchmark could not run (a server, a child process or a load failed)."""


# ------------------------------------------------------------------------ databases


def dsn_with_database(dsn: str, database: str) -> str:
    """``dsn`` (a ``postgresql://`` URL) pointed at another database on the same server."""
    parts = urlsplit(dsn)
    if not parts.scheme.startswith("postgres"):
        raise BenchError(f"need a postgresql:// URL to create benchmark databases, got {dsn!r}")
    return urlunsplit(parts._replace(path="/" + quote(database, safe="")))


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Databases:
    """A fresh, migrated database per benchmark phase on one server, dropped afterwards.

    ``admin_dsn`` must be allowed to ``CREATE DATABASE`` (the embedded server's superuser is).
    """

    def __init__(self, admin_dsn: str, prefix: str = "chronoq_bench") -> None:
        self.admin_dsn = admin_dsn
        self.prefix = prefix

    async def _admin(self, sql: str) -> None:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    @contextlib.asynccontextmanager
    async def fresh(self, label: str) -> AsyncIterator[str]:
        """Create ``<prefix>_<label>_<random>``, migrate it, yield its DSN, drop it."""
        name = f"{self.prefix}_{label}_{uuid.uuid4().hex[:8]}"
        await self._admin(f"CREATE DATABASE {_ident(name)}")
        try:
            dsn = dsn_with_database(self.admin_dsn, name)
            store = await Store.connect(dsn, min_size=1, max_size=1)
            await store.close()
            yield dsn
        finally:
            await self._admin(f"DROP DATABASE IF EXISTS {_ident(name)} WITH (FORCE)")


async def server_settings(dsn: str) -> dict[str, str]:
    """The server's version and the settings that decide write durability."""
    conn = await asyncpg.connect(dsn)
    try:
        out = {}
        for name in ("server_version", "fsync", "synchronous_commit", "full_page_writes",
                     "shared_buffers"):
            out[name] = str(await conn.fetchval(f"SHOW {name}"))
        return out
    finally:
        await conn.close()


# ------------------------------------------------------------------------ bulk loads


async def copy_tasks(
    dsn: str,
    count: int,
    first: datetime,
    spread: timedelta,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    bucket_seconds: int = DEFAULT_BUCKET_SECONDS,
    chunk: int = 50_000,
    progress: Callable[[int], None] | None = None,
) -> float:
    """COPY ``count`` pending tasks into ``tasks`` (one transaction per chunk), then ANALYZE.

    Returns the seconds the load took. ANALYZE gives the planner the statistics a table in
    production would have; a table analysed while empty would mislead it.
    """
    now = datetime.now(UTC)
    rows = task_rows(
        count, first, spread, now=now, partitions=partitions, bucket_seconds=bucket_seconds
    )
    started = time.perf_counter()
    conn = await asyncpg.connect(dsn)
    try:
        await copy_rows(conn, rows, count, progress=progress, chunk=chunk)
        await conn.execute("ANALYZE tasks")
    finally:
        await conn.close()
    return time.perf_counter() - started


# ------------------------------------------------------------------------ ceilings


@dataclass
class RawCeilings:
    """Rows per second of chronoq's statements run bare; keyed by connections where it varies."""

    rows: int
    insert_batch: int
    claim_batch: int
    insert_per_s: dict[int, float]
    fire_per_s: float
    fire_statements: int
    claim_complete_per_s: dict[int, float]

    def insert_with(self, connections: int) -> float:
        """The insert ceiling at ``connections`` (or the best one when not measured)."""
        return self.insert_per_s.get(connections, max(self.insert_per_s.values()))

    @property
    def claim_complete_best(self) -> tuple[int, float]:
        """(connections, rows/s) of the fastest claim-and-complete run."""
        return max(self.claim_complete_per_s.items(), key=lambda kv: kv[1])

    @property
    def pipeline_per_s(self) -> float:
        """Fire, then claim and complete, one after the other: the serial end-to-end ceiling."""
        return 1 / (1 / self.fire_per_s + 1 / self.claim_complete_best[1])


def _insert_columns(batch: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    """``insert_task_ids`` parameters $1..$24 from COPY-shaped rows, as the store makes them
    (content type and trace context NULL: bytes, untraced; no queue controls, each of their
    columns one NULL for every row)."""
    cols: list[list[Any]] = [[] for _ in range(18)]
    for r in batch:
        (task_id, namespace, queue, partition, bucket, run_at, state, payload, max_attempts,
         backoff_initial, backoff_max, lease_timeout, misfire_grace, _created) = r
        row = (task_id, namespace, queue, partition, bucket, run_at, state, 0, payload, None,
               max_attempts, backoff_initial, backoff_max, lease_timeout, 0, misfire_grace, None,
               None)
        for col, value in zip(cols, row, strict=True):
            col.append(value)
    return [*cols, *([None] for _ in range(6))]


async def _on_each(
    conns: Sequence[asyncpg.Connection], job: Callable[[asyncpg.Connection], Any]
) -> float:
    """Run ``job`` on every connection at once; the seconds until all are done."""
    started = time.perf_counter()
    await asyncio.gather(*(job(c) for c in conns))
    return time.perf_counter() - started


async def _raw_insert(
    conns: Sequence[asyncpg.Connection],
    rows: int,
    batch: int,
    partitions: int,
    now: datetime,
    *,
    keyed: bool = False,
) -> float:
    """Insert ``rows`` in batches of ``batch``, the connections taking batches in turn;
    ``keyed``: each with an idempotency key, as the SDK gives every task."""
    source = list(task_rows(
        rows, now + timedelta(minutes=5), timedelta(hours=1), now=now, partitions=partitions
    ))
    batches = [_insert_columns(source[i:i + batch]) for i in range(0, rows, batch)]
    if keyed:
        for cols in batches:
            cols[9] = [str(uuid.uuid4()) for _ in cols[0]]
    statements = {c: await c.prepare(q("insert_task_ids")) for c in conns}
    queue = iter(batches)

    async def job(conn: asyncpg.Connection) -> None:
        for cols in queue:
            await statements[conn].fetch(*cols, now)

    return rows / await _on_each(conns, job)


async def insert_ceiling(
    dsn: str,
    rows: int,
    *,
    connections: int = 1,
    batch: int = 1000,
    partitions: int = DEFAULT_PARTITIONS,
    keyed: bool = False,
) -> float:
    """Rows/s of ``insert_task_ids`` alone (batches of ``batch``, prepared, each connection
    taking batches in turn) on ``dsn``, a fresh migrated database: the submit ceiling;
    ``keyed``: every row with an idempotency key (the unique index's work included)."""
    conns = [
        await asyncpg.connect(dsn, server_settings={"timezone": "UTC"}) for _ in range(connections)
    ]
    try:
        return await _raw_insert(
            conns, rows, batch, partitions, datetime.now(UTC), keyed=keyed
        )
    finally:
        for conn in conns:
            await conn.close()


async def _raw_fire(
    conn: asyncpg.Connection, rows: int, partitions: int, fire_batch: int, now: datetime
) -> tuple[float, int]:
    """Fire everything with the firer's batching: all partitions, then the saturated ones."""
    fences = await conn.fetch(q("take_fences_local"), list(range(partitions)), "raw", "local")
    owned = {r["partition"]: r["token"] for r in fences}
    fire_at = now + timedelta(hours=2)
    current = bucket_of(fire_at, DEFAULT_BUCKET_SECONDS)
    fire = await conn.prepare(q("fire_due"))
    # $6 says who fires (the node id, since migration 0002): name this bench; $7 the horizon
    # that stored durations saturate at, in ms.
    who = ("raw-bench", Limits().horizon // timedelta(milliseconds=1))
    fired = statements = 0
    pending = owned
    started = time.perf_counter()
    while fired < rows:
        if not pending:
            pending = owned
        per_partition = max(50, math.ceil(fire_batch / len(pending)))
        result = await fire.fetch(
            list(pending), list(pending.values()), current, fire_at, per_partition, *who
        )
        statements += 1
        if not result:
            break
        fired += len(result)
        pending = {r["partition"]: owned[r["partition"]] for r in result if r["more"]}
    return fired / (time.perf_counter() - started), statements


async def _raw_claim_complete(
    conns: Sequence[asyncpg.Connection], rows: int, claim_batch: int
) -> float:
    """Claim ``claim_batch`` and complete them, on every connection, until ``rows`` are done."""
    now = datetime.now(UTC) + timedelta(hours=2)
    claims = {c: await c.prepare(q("claim")) for c in conns}
    limits = Limits()  # the lease timeout bounds that claim saturates stored timeouts to, in ms
    lease_bounds = (
        limits.min_lease_timeout // timedelta(milliseconds=1),
        limits.max_lease_timeout // timedelta(milliseconds=1),
    )
    completes = {c: await c.prepare(q("complete")) for c in conns}
    done = 0

    async def job(conn: asyncpg.Connection) -> None:
        nonlocal done
        while done < rows:
            take = min(claim_batch, rows - done)
            got = await claims[conn].fetch(
                NAMESPACE, [QUEUE], take, f"raw-{id(conn)}", now, [take],  # per-queue cap
                *lease_bounds, MAX_ANSWER_BYTES, TASK_FIXED_BYTES,  # the answer's byte budget
            )
            if not got:
                return
            done += len(got)
            await completes[conn].fetch(
                NAMESPACE, [r["id"] for r in got], [r["attempt"] for r in got], now
            )

    seconds = await _on_each(conns, job)
    return done / seconds


async def measure_ceilings(
    dsn: str,
    *,
    rows: int,
    connections: Sequence[int] = (1, 2, 4),
    insert_batch: int = 1000,
    claim_batch: int = 64,
    partitions: int = DEFAULT_PARTITIONS,
    fire_batch: int = 5000,
) -> RawCeilings:
    """Insert ``rows`` (batches of ``insert_batch``), fire them all, then claim and complete.

    Insert and claim-and-complete run once per count in ``connections``, each on its share of
    the rows; firing runs on one connection, as the firing loop does. Statements are prepared
    before the clock starts. ``dsn`` must be a fresh, migrated database.
    """
    counts = sorted(set(connections))
    share = max(1, rows // len(counts))
    conns = [
        await asyncpg.connect(dsn, server_settings={"timezone": "UTC"}) for _ in range(max(counts))
    ]
    try:
        now = datetime.now(UTC)
        inserts = {
            n: await _raw_insert(conns[:n], share, insert_batch, partitions, now) for n in counts
        }
        await conns[0].execute("ANALYZE tasks")
        fire, statements = await _raw_fire(conns[0], share * len(counts), partitions, fire_batch,
                                           now)
        await conns[0].execute("ANALYZE tasks")
        claims = {n: await _raw_claim_complete(conns[:n], share, claim_batch) for n in counts}
    finally:
        for conn in conns:
            await conn.close()
    return RawCeilings(
        rows=rows, insert_batch=insert_batch, claim_batch=claim_batch, insert_per_s=inserts,
        fire_per_s=fire, fire_statements=statements, claim_complete_per_s=claims,
    )
