"""Statements that name tasks by id keep their plan when the statistics lag the queue.

A queue's states change by the thousand a second; ANALYZE sees one moment of them, and a new
table none at all. These tests read the plans the store's connections get (each execution
planned with its arguments) in two such moments: the table analyzed while every task was
SCHEDULED and some then leased (as a loaded cluster is between two autoanalyzes), and a table
never analyzed that a flood filled. Each by-id statement must follow its ids through the
primary key once, never scan a namespace's or a state's rows, nor repeat its id list per
owned partition; the firing lanes must read the firing index.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from chronoq.buckets import bucket_of
from chronoq.clock import ManualClock
from chronoq.models import TaskSpec
from chronoq.store import Store
from chronoq.store.sql import q

pytestmark = pytest.mark.timeout(90)

TASKS = 4000
RUNNING = 400


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += _nodes(child)
    return out


async def _plan(conn: asyncpg.Connection, name: str, *args: Any) -> list[dict[str, Any]]:
    """The executed plan of statement ``name`` with ``args`` (rolled back), flattened."""
    tx = conn.transaction()
    await tx.start()
    try:
        # A few thousand rows are read fastest whole; in service the table is large.
        await conn.execute("SET LOCAL enable_seqscan = off")
        (doc,) = await conn.fetchrow("EXPLAIN (ANALYZE, FORMAT JSON) " + q(name), *args)
    finally:
        await tx.rollback()
    return _nodes(json.loads(doc)[0]["Plan"])


def _task_indexes(nodes: list[dict[str, Any]]) -> set[str]:
    """The indexes of ``tasks`` a plan reads ("seq" for a scan of the table)."""
    used = {n["Index Name"] for n in nodes if str(n.get("Index Name", "")).startswith("tasks")}
    seq = [n for n in nodes if n["Node Type"] == "Seq Scan" and n["Relation Name"] == "tasks"]
    return used | ({"seq"} if seq else set())


@pytest.fixture(params=["lagging", "unanalyzed"])
async def leased(
    request: pytest.FixtureRequest, store: Store, clock: ManualClock
) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """TASKS due in a second, then RUNNING of them leased: analyzed while all were SCHEDULED
    ("lagging"), or never ("unanalyzed"). Returns (scheduled ids, running ids)."""
    now = clock.now()
    submitted = await store.submit_ids(
        [TaskSpec(queue="p", run_at=now + timedelta(seconds=1)) for _ in range(TASKS)], now
    )
    ids = [uuid.UUID(task_id) for task_id, _ in submitted]
    async with store.pool.acquire() as conn:
        if request.param == "lagging":
            await conn.execute("ANALYZE tasks")
        await conn.execute(
            "UPDATE tasks SET state = 2, attempt = 1, worker_id = 'w', fired_at = $2,"
            " lease_until = $2::timestamptz + interval '1 minute' WHERE id = ANY($1::uuid[])",
            ids[:RUNNING],
            now,
        )
    return ids[RUNNING:], ids[:RUNNING]


async def test_the_store_plans_every_execution_with_its_arguments(store: Store) -> None:
    """No generic plan cached while the table was empty outlives the table's growth."""
    async with store.pool.acquire() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"


async def test_acks_follow_their_ids_whatever_the_statistics_say(
    store: Store, clock: ManualClock, leased: tuple[list[uuid.UUID], list[uuid.UUID]]
) -> None:
    _, running = leased
    acked = running[:50]
    n, now = len(acked), clock.now()
    later = now + timedelta(seconds=30)
    statements: dict[str, list[Any]] = {
        "complete": ["default", acked, [1] * n, now],
        "heartbeat": ["default", acked, [1] * n, now, 1000, 86_400_000],
        "lease_states": ["default", acked],
        "retry_running": [
            acked, [1] * n, [0] * n, [later] * n, [bucket_of(later)] * n, ["x"] * n, now
        ],
    }
    async with store.pool.acquire() as conn:
        for name, args in statements.items():
            nodes = await _plan(conn, name, *args)
            assert _task_indexes(nodes) == {"tasks_pkey"}, name
            assert nodes[0]["Actual Rows"] == n, name


async def test_wheel_fire_reads_its_ids_once_whatever_the_statistics_say(
    store: Store, clock: ManualClock, leased: tuple[list[uuid.UUID], list[uuid.UUID]]
) -> None:
    scheduled, _ = leased
    now = clock.now() + timedelta(seconds=2)
    owned = {p: 100 + p for p in range(store.partitions)}  # tokens differ, as in service
    for p, token in owned.items():
        assert await store.take_fence(p, token, "cid", "me") is not None
    fired = scheduled[:600]
    base = [list(owned), list(owned.values()), bucket_of(now), now, fired, "me", 86_400_000]
    async with store.pool.acquire() as conn:
        await conn.execute("ANALYZE partition_fences")
        for name, extra in (
            ("fire_ids", []),
            (
                "fire_ids_leasing",
                [fired[:100], ["w"] * 100, 1000, 86_400_000, [0] * 100, [3 << 20] * 100, 256],
            ),
        ):
            nodes = await _plan(conn, name, *base, *extra)
            assert _task_indexes(nodes) == {"tasks_pkey"}, name
            for scan in nodes:
                if "ANY" in scan.get("Index Cond", "") and scan["Index Name"] == "tasks_pkey":
                    # The id list is walked once, not once per owned partition.
                    assert scan["Actual Loops"] == 1, (name, scan)
            assert nodes[0]["Actual Rows"] == len(fired), name


async def test_lanes_read_the_firing_index_on_a_table_never_analyzed(
    store: Store, clock: ManualClock
) -> None:
    """The wheel's load and the tick read each (bucket, namespace) lane through tasks_due on
    a new table that a flood filled before any ANALYZE (a new cluster's first minutes)."""
    now = clock.now()
    owned = {p: 100 + p for p in range(store.partitions)}
    for p, token in owned.items():
        assert await store.take_fence(p, token, "cid", "me") is not None
    flood = [
        TaskSpec(queue="p", run_at=now + timedelta(milliseconds=10 * i)) for i in range(1, 4000)
    ]
    await store.submit_ids(flood, now)
    until = now + timedelta(seconds=5)
    due = sum(1 for t in flood if t.run_at <= until)
    statements: dict[str, list[Any]] = {
        "due_soon": [list(owned), bucket_of(now), bucket_of(until), now, until, 10_000, 64],
        "fire_due": [
            list(owned), list(owned.values()), bucket_of(until), until, 10_000, "me", 86_400_000
        ],
    }
    async with store.pool.acquire() as conn:
        for name, args in statements.items():
            nodes = await _plan(conn, name, *args)
            assert _task_indexes(nodes) <= {"tasks_due", "tasks_pkey"}, name
            assert nodes[0]["Actual Rows"] == due, name
