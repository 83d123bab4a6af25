"""The firing scan against a naive scheduler's scans, as PostgreSQL plans and runs them.

Each ``Strategy`` is one way of finding the tasks due by now: a full-table scan, an index on
``run_at`` (with or without a watermark), or chronoq's bucketed ``fire_due`` scan. The
benchmark times them over growing loads; the lab shows one ``EXPLAIN (ANALYZE, BUFFERS)`` of
each on its live cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from chronoq.config import NodeSettings
from chronoq.store.sql import q

#: The index a naive scheduler would add; built for the benchmark only.
RUN_AT_INDEX = "tasks_bench_run_at"
#: Indexes of chronoq's schema that would rescue the naive queries; dropped (in a transaction
#: that is rolled back) where a strategy stands for a schema without them.
CHRONOQ_INDEXES = ("tasks_due", "tasks_listing", "tasks_queue_states")

_NAIVE = "SELECT id FROM tasks WHERE run_at <= $1 AND state = 0"
_WATERMARKED = "SELECT id FROM tasks WHERE run_at >= $1 AND run_at <= $2 AND state = 0"


class QueryShapeError(RuntimeError):
    """``fire_due`` in queries.sql no longer has the shape ``fire_select`` cuts it at."""


@dataclass(frozen=True)
class Strategy:
    """One way of finding the due tasks: its SQL and the session it runs in."""

    key: str
    name: str
    sql: str
    setup: tuple[str, ...]
    note: str


def fire_select() -> str:
    """``fire_due`` from queries.sql with its UPDATE cut off and its row locks removed.

    The benchmark then times the very index range scan the firing loop runs, without moving
    any task (so it can repeat) and without dirtying pages with row locks.
    """
    sql = q("fire_due")
    head, sep, _update = sql.partition("\nUPDATE tasks t")
    locks = ("FOR SHARE OF f", "FOR UPDATE SKIP LOCKED")
    if not sep or not all(lock in head for lock in locks):
        raise QueryShapeError(
            "fire_due in queries.sql changed shape; update chronoq.diagnostics.scans"
        )
    for lock in locks:
        head = head.replace(lock, "")
    return head + "\nSELECT id FROM due"


def fire_limit(partitions: int, busiest: int = 0) -> int:
    """``fire_due``'s per-partition LIMIT as the firing loop sets it for ``partitions``.

    ``chronoq.node.owner.firing``: ``max(50, ceil(fire_batch / partitions))``. Raised to the
    busiest partition's due count so one statement finds every due row (where the loop
    would run a second statement for that partition): the figures then compare like with like.
    """
    fire_batch = next(f.default for f in dataclasses.fields(NodeSettings) if f.name == "fire_batch")
    assert isinstance(fire_batch, int)
    return max(50, math.ceil(fire_batch / max(partitions, 1)), busiest)


def strategies() -> list[Strategy]:
    """The strategies, cheapest schema first; see the module docstring."""
    no_index_scans = (
        "SET LOCAL enable_indexscan = off",
        "SET LOCAL enable_indexonlyscan = off",
        "SET LOCAL enable_bitmapscan = off",
    )
    naive_schema = tuple(f"DROP INDEX {name}" for name in CHRONOQ_INDEXES)
    fire = fire_select()
    return [
        Strategy("a", "full scan", _NAIVE, no_index_scans, "Seq Scan forced: index scans off"),
        Strategy(
            "b",
            "run_at index, walking history",
            _NAIVE,
            (*naive_schema, "SET LOCAL enable_seqscan = off", "SET LOCAL enable_bitmapscan = off"),
            f"{RUN_AT_INDEX} only; seq and bitmap scans off",
        ),
        Strategy(
            "b2",
            "run_at index + watermark",
            _WATERMARKED,
            naive_schema,
            f"{RUN_AT_INDEX} only; planner's choice",
        ),
        Strategy("c", "bucketed, 1 partition", fire, (), "fire_due's scan, busiest partition"),
        Strategy(
            "c2",
            "bucketed, 1 node's partitions",
            fire,
            (),
            "fire_due's scan, every partition p with p % nodes == 0",
        ),
        Strategy("c3", "bucketed, all partitions", fire, (), "fire_due's scan, one node alone"),
    ]


@dataclass(frozen=True)
class Explained:
    """What one ``EXPLAIN (ANALYZE, BUFFERS)`` run of a strategy showed."""

    due: int  # rows the statement returned
    examined: int  # rows of ``tasks`` its scans read
    shared_hit: int
    shared_read: int
    server_ms: float  # "Execution Time", with per-node timing on
    plan: str  # the scan nodes on tasks


@contextlib.asynccontextmanager
async def strategy_session(conn: asyncpg.Connection, strategy: Strategy) -> AsyncIterator[None]:
    """A transaction holding ``strategy``'s settings (and dropped indexes), rolled back after.

    Parallel query is off (a tick is one backend's work) and plans are custom, so the plan
    EXPLAIN shows is the plan that is timed.
    """
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        for setting in strategy.setup:
            await conn.execute(setting)
        yield
    finally:
        await tx.rollback()


async def explain_analyze(conn: asyncpg.Connection, sql: str, args: Sequence[Any]) -> Explained:
    """``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of ``sql``, reduced to the figures we show."""
    raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
    explained = json.loads(raw)[0]
    top = explained["Plan"]
    examined, nodes = rows_examined(top)
    return Explained(
        due=round(top.get("Actual Rows", 0) * top.get("Actual Loops", 1)),
        examined=examined,
        shared_hit=int(top.get("Shared Hit Blocks", 0)),
        shared_read=int(top.get("Shared Read Blocks", 0)),
        server_ms=float(explained.get("Execution Time", 0.0)),
        plan=nodes,
    )


_SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan")


def rows_examined(plan: dict[str, Any]) -> tuple[int, str]:
    """Rows of ``tasks`` that the scans of an EXPLAIN (ANALYZE, FORMAT JSON) plan read.

    A scan reads the rows it returns plus those its filter (or a recheck) threw away, on
    every loop; EXPLAIN reports both per loop (PostgreSQL 18 rounds the average to two
    decimals, so a scan looped over 256 partitions may be off by one). Also returns the scan
    nodes, for the table.
    """
    total = 0.0
    kinds: list[str] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        if node.get("Node Type") == "Bitmap Index Scan":
            kinds.append(f"Bitmap Index Scan ({node.get('Index Name')})")
        if node.get("Node Type") not in _SCANS or node.get("Relation Name") != "tasks":
            continue
        per_loop = (
            node.get("Actual Rows", 0)
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        total += per_loop * node.get("Actual Loops", 1)
        index = node.get("Index Name")
        kinds.append(f"{node['Node Type']}" + (f" ({index})" if index else ""))
    return round(total), ", ".join(sorted(set(kinds)))
