"""What the lab reads from the store: each figure on the page is one of these queries.

Every probe takes a connection and the virtual ``now`` as arguments (never SQL ``now()``), so
the page shows the cluster's own time. The scans are the benchmark's
(``chronoq.bench.scan``), run live with ``EXPLAIN (ANALYZE, BUFFERS)`` against the same
table the nodes fire from.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from chronoq.buckets import bucket_of
from chronoq.diagnostics.scans import (
    Explained,
    explain_analyze,
    fire_limit,
    strategies,
    strategy_session,
)
from chronoq.diagnostics.task_rows import COPY_COLUMNS, copy_rows, task_rows
from chronoq.models import DEFAULT_NAMESPACE, TaskState
from chronoq.store.store import known

LAB_QUEUE = "lab"
DAY = timedelta(days=1)
#: Buckets the histogram shows: the day's 1,440, starting this many before the current one.
HISTORY_BUCKETS = 10
DAY_BUCKETS = 1440


@dataclass(frozen=True)
class Histogram:
    """Pending tasks per bucket over the day's window, and what lies outside it."""

    first_bucket: int
    current_bucket: int
    counts: list[int]
    before: int  # pending in buckets before the window (a backlog nobody fired)
    after: int  # pending beyond the window
    pending: int  # all pending tasks


async def pending_histogram(conn: asyncpg.Connection, now: datetime, width: int) -> Histogram:
    """Pending per bucket (the ``tasks_due`` index holds exactly these rows)."""
    rows = await conn.fetch("SELECT bucket, count(*) AS n FROM tasks WHERE state = 0 GROUP BY 1")
    current = bucket_of(now, width)
    first = current - HISTORY_BUCKETS
    counts = [0] * DAY_BUCKETS
    before = after = total = 0
    for r in rows:
        b, n = int(r["bucket"]), int(r["n"])
        total += n
        if b < first:
            before += n
        elif b >= first + DAY_BUCKETS:
            after += n
        else:
            counts[b - first] = n
    return Histogram(first, current, counts, before, after, total)


async def state_counts(conn: asyncpg.Connection) -> dict[str, int]:
    """Tasks per state past SCHEDULED, through ``tasks_listing`` (not the pending backlog)
    and the history's listing index (finished tasks retired there, migration 0022)."""
    rows = await conn.fetch(
        "SELECT state, count(*) AS n FROM tasks_with_history WHERE namespace = $1 AND state > 0"
        " GROUP BY 1",
        DEFAULT_NAMESPACE,
    )
    counts = {s.name.lower(): 0 for s in TaskState if s != TaskState.SCHEDULED}
    for r in rows:
        counts[known(TaskState, r["state"], TaskState.DEAD).name.lower()] = int(r["n"])
    return counts


@dataclass(frozen=True)
class Firing:
    """Owner firings since a virtual instant, and their lateness (virtual ms)."""

    fired: int
    lateness_p50_ms: float
    lateness_p99_ms: float


async def firing_since(conn: asyncpg.Connection, since: datetime) -> Firing:
    row = await conn.fetchrow(
        # percentile_disc is the nearest-rank percentile of chronoq.stats: the same p99.
        "SELECT count(*) AS n,"
        " percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM fired_at - run_at))"
        "   AS p50,"
        " percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM fired_at - run_at))"
        "   AS p99"
        " FROM tasks_with_history WHERE namespace = $1 AND state > 0"
        "   AND fire_token IS NOT NULL AND fired_at > $2",
        DEFAULT_NAMESPACE, since,
    )
    assert row is not None
    return Firing(int(row["n"]), float(row["p50"] or 0) * 1000, float(row["p99"] or 0) * 1000)


@dataclass(frozen=True)
class DoubleFirings:
    """Evidence of two owners firing one partition: both must stay at zero.

    ``regressions``: a task fired with a smaller fencing token than one fired before it in
    the same partition (an older owner fired after a newer one took over). ``shared_tokens``:
    one (partition, token) fired by two nodes.
    """

    checked: int
    regressions: int
    shared_tokens: int

    @property
    def total(self) -> int:
        return self.regressions + self.shared_tokens


async def double_firings(conn: asyncpg.Connection) -> DoubleFirings:
    """Per partition, in fired_at order, fencing tokens never go back; one node per token."""
    row = await conn.fetchrow(
        """
        WITH fired AS (
            SELECT partition, fire_token, fired_by,
                   max(fire_token) OVER (
                       PARTITION BY partition ORDER BY fired_at, fire_token
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_max
            FROM tasks_with_history
            WHERE namespace = $1 AND state > 0 AND fire_token IS NOT NULL
        ), tokens AS (
            SELECT partition, fire_token FROM fired GROUP BY 1, 2
            HAVING count(DISTINCT fired_by) > 1
        )
        SELECT (SELECT count(*) FROM fired) AS checked,
               (SELECT count(*) FROM fired WHERE fire_token < before_max) AS regressions,
               (SELECT count(*) FROM tokens) AS shared_tokens
        """,
        DEFAULT_NAMESPACE,
    )
    assert row is not None
    return DoubleFirings(int(row["checked"]), int(row["regressions"]), int(row["shared_tokens"]))


async def pending_ids_between(
    conn: asyncpg.Connection, start: datetime, end: datetime, partitions: int, width: int
) -> list[uuid.UUID]:
    """Pending tasks with ``start < run_at <= end``: what an advance of the clock will fire.

    Goes through ``tasks_due`` partition by partition, as the owners will.
    """
    rows = await conn.fetch(
        "SELECT id FROM tasks WHERE state = 0 AND partition = ANY($1::smallint[])"
        " AND bucket BETWEEN $2 AND $3 AND run_at > $4 AND run_at <= $5",
        list(range(partitions)), bucket_of(start, width), bucket_of(end, width), start, end,
    )
    return [r["id"] for r in rows]


async def states_of(conn: asyncpg.Connection, ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """How many of ``ids`` are fired (past SCHEDULED) and executed (SUCCEEDED), by id (live or
    retired into the history)."""
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE state <> 0) AS fired,"
        " count(*) FILTER (WHERE state = 3) AS executed,"
        " count(DISTINCT fired_by) FILTER (WHERE state <> 0) AS firers"
        " FROM tasks_with_history WHERE id = ANY($1::uuid[])",
        list(ids),
    )
    assert row is not None
    return {k: int(row[k]) for k in ("fired", "executed", "firers")}


@dataclass(frozen=True)
class ScanPair:
    """The naive scan beside chronoq's bucketed one, for the same ``at``."""

    at: datetime
    naive: Explained
    bucketed: Explained


async def compare_scans(conn: asyncpg.Connection, at: datetime, width: int) -> ScanPair:
    """Find the tasks due by ``at`` both ways, for real, under EXPLAIN ANALYZE.

    Naive: ``run_at <= at AND state = 0`` with index scans off (a table without chronoq's
    index). Bucketed: ``fire_due``'s scan over every partition with the stored fencing
    tokens and watermarks, exactly as the owners run it.
    """
    by_key = {s.key: s for s in strategies()}
    naive, bucketed = by_key["a"], by_key["c3"]
    async with strategy_session(conn, naive):
        seen_naive = await explain_analyze(conn, naive.sql, (at,))
    fences = await conn.fetch("SELECT partition, token FROM partition_fences ORDER BY partition")
    parts = [r["partition"] for r in fences]
    args = (parts, [r["token"] for r in fences], bucket_of(at, width), at, fire_limit(len(parts)))
    async with strategy_session(conn, bucketed):
        seen_bucketed = await explain_analyze(conn, bucketed.sql, args)
    return ScanPair(at, seen_naive, seen_bucketed)


def lab_rows(
    count: int, first: datetime, partitions: int, width: int
) -> Iterator[tuple[Any, ...]]:
    """``count`` pending lab tasks (``COPY_COLUMNS``) spread evenly over a day from ``first``."""
    queue_at = COPY_COLUMNS.index("queue")
    now = datetime.now(UTC)
    for row in task_rows(count, first, DAY, now=now, partitions=partitions, bucket_seconds=width):
        yield (*row[:queue_at], LAB_QUEUE, *row[queue_at + 1:])


async def copy_pending(
    conn: asyncpg.Connection, count: int, first: datetime, partitions: int, width: int,
    progress: Callable[[int], None], chunk: int = 20_000,
) -> float:
    """COPY ``count`` pending tasks in chunks (one transaction each), then ANALYZE; seconds."""
    started = time.perf_counter()
    await copy_rows(
        conn, lab_rows(count, first, partitions, width), count, progress=progress, chunk=chunk
    )
    await conn.execute("ANALYZE tasks")
    return time.perf_counter() - started
