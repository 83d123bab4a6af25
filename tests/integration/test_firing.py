"""Firing by time bucket: backfill, misfire policy, fencing and the shape of the hot query."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest

from chronoq.buckets import bucket_of
from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.coordinator.local import LocalOwnership
from chronoq.errors import StoreUnavailable
from chronoq.models import MisfirePolicy, TaskSpec, TaskState
from chronoq.store import Store
from chronoq.store.sql import q
from chronoq.store.store import IDLE_IN_TRANSACTION_TIMEOUT_MS, _translated
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(90)


async def test_backfill_after_downtime_fires_each_task_once(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock, fire_batch=40)  # small batches: backfill takes several
    client = Client(node.address)
    try:
        specs = [
            NewTask(queue="bf", delay=timedelta(seconds=20 + 7 * i)) for i in range(600)
        ]  # due over the next ~70 minutes: dozens of buckets
        subs = await client.submit_many(specs)
        await node.stop()  # the only node goes down before any of them is due

        clock.advance(timedelta(minutes=90))
        node2 = await make_node(clock=clock, fire_batch=40)
        assert node2.firer is not None
        for _ in range(20):
            if not (await node2.firer.tick()).fired:
                break
        counts = await store.count_by_state()
        assert counts == {TaskState.READY: 600}
        # Each fired exactly once: a fire moves SCHEDULED → READY only; claims see each once.
        claimer = Client(node2.address)
        seen: list[str] = []
        while batch := await claimer.claim(["bf"], max_tasks=250):
            seen += [t.id for t in batch]
            assert all(t.attempt == 1 for t in batch)
        await claimer.close()
        assert sorted(seen) == sorted(s.task.id for s in subs)
        # Watermarks moved up to the current bucket: later ticks scan only the due range.
        current = bucket_of(clock.now())
        assert {f.watermark for f in await store.fences()} == {current}
    finally:
        await client.close()


async def test_misfire_skip_records_why(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock)
    client = Client(node.address)
    try:
        skip = await client.submit(
            "m",
            delay=timedelta(seconds=30),
            misfire_policy=MisfirePolicy.SKIP,
            misfire_grace=timedelta(seconds=60),
        )
        late = await client.submit("m", delay=timedelta(seconds=30))
        in_grace = await client.submit(
            "m",
            delay=timedelta(seconds=200),
            misfire_policy=MisfirePolicy.SKIP,
            misfire_grace=timedelta(seconds=60),
        )
        await node.stop()
        clock.advance(timedelta(minutes=4))  # 210 s past the first two, 40 s past the third
        node2 = await make_node(clock=clock)
        assert node2.firer is not None
        result = await node2.firer.tick()
        assert (result.fired, result.skipped) == (2, 1)
        skipped = await store.get(skip.task.id, "default")
        assert skipped.state is TaskState.SKIPPED
        assert "misfire" in (skipped.last_error or "") and skipped.finished_at is not None
        assert (await store.get(late.task.id, "default")).state is TaskState.READY
        assert (await store.get(in_grace.task.id, "default")).state is TaskState.READY
    finally:
        await client.close()


async def test_stale_fencing_token_fires_nothing(store: Store, clock: ManualClock) -> None:
    now = clock.now()
    await store.submit(
        [TaskSpec(queue="z", run_at=now + timedelta(seconds=5)) for _ in range(50)], now
    )
    old = LocalOwnership(store, "old")
    await old.start()
    new = LocalOwnership(store, "new")
    await new.start()  # bumps every token: "old" is fenced
    later = now + timedelta(seconds=10)
    assert (await store.fire_due(old.owned(), later)).fired == 0
    assert await store.advance_watermarks(old.owned(), bucket_of(later) + 5) == set()
    assert await store.reap_expired(old.owned(), later) == []
    assert (await store.fire_due(new.owned(), later)).fired == 50


async def test_fire_query_examines_only_due_rows(store: Store, clock: ManualClock) -> None:
    """EXPLAIN ANALYZE: the bucketed index range scans read the due rows and no others, plus
    one index probe per (bucket, namespace) lane of the due window."""
    now = clock.now()
    day = [TaskSpec(queue="e", run_at=now + timedelta(seconds=90 + i * 4)) for i in range(20_000)]
    for i in range(0, len(day), 5000):
        await store.submit(day[i : i + 5000], now)
    soon = await store.submit(
        [
            TaskSpec(
                queue="e",
                namespace="default" if s % 4 else "other",
                run_at=now + timedelta(seconds=s % 40 + 1),
            )
            for s in range(400)
        ],
        now,
    )
    later = now + timedelta(seconds=30)
    target = soon[0].task.partition
    due_in_target = sum(1 for o in soon if o.task.partition == target and o.task.run_at <= later)
    pending_in_target = sum(1 for o in await store_pending(store, target))
    assert due_in_target > 0
    fence = (await store.take_fences_local([target], "explainer"))[target]
    async with store.pool.acquire() as conn:
        await conn.execute("ANALYZE tasks")
        await conn.execute("BEGIN")
        try:
            (plan_json,) = await conn.fetchrow(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q("fire_due"),
                [target],
                [fence.token],
                bucket_of(later),
                later,
                10_000,
                "explainer",
                store.horizon // timedelta(milliseconds=1),
            )
        finally:
            await conn.execute("ROLLBACK")
    scans = [
        n for n in _nodes(json.loads(plan_json)[0]["Plan"]) if n.get("Index Name") == "tasks_due"
    ]
    assert scans, "the fire query must use the bucketed index tasks_due"
    assert all(scan["Node Type"] in ("Index Scan", "Index Only Scan") for scan in scans)
    in_target = [o.task for o in soon if o.task.partition == target]
    lanes = {t.namespace for t in in_target}  # all in one bucket
    due_lanes = {t.namespace for t in in_target if t.run_at <= later}
    # The due lanes' scans: one index range per (bucket, namespace), up to now: in the lane's
    # bucket, (namespace, run_at) from the lane's start to (its namespace, now).
    ranges = [s for s in scans if "run_at" in s["Index Cond"]]
    assert ranges and all(
        "ROW(namespace, run_at) >=" in s["Index Cond"]
        and "ROW(namespace, run_at) <=" in s["Index Cond"]
        for s in ranges
    ), [s["Index Cond"] for s in ranges]
    assert sum(round(s["Actual Loops"]) for s in ranges) == len(due_lanes)
    # The loose index scan that lists the lanes: one probe each, and one that finds no more.
    probes = [s for s in scans if s not in ranges]
    assert probes and sum(round(s["Actual Loops"]) for s in probes) == len(lanes) + 1
    examined = sum(_examined(s) for s in ranges)
    assert examined == due_in_target, (examined, due_in_target, pending_in_target)
    assert sum(_examined(s) for s in probes) == len(lanes)
    assert pending_in_target > 20 * due_in_target  # the pending backlog was not read


def _examined(scan: dict[str, Any]) -> int:
    """Index entries a scan node read over all its loops (EXPLAIN shows per-loop averages)."""
    per_loop = scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0)
    return round(per_loop * scan["Actual Loops"])


async def store_pending(store: Store, partition: int) -> list[int]:
    async with store.pool.acquire() as conn:
        rows = await conn.fetch("SELECT 1 FROM tasks WHERE state = 0 AND partition = $1", partition)
    return [1 for _ in rows]


def _nodes(plan: dict[str, object]) -> list[dict[str, object]]:
    out = [plan]
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        out += _nodes(child)
    return out


async def test_a_silent_owner_mid_transaction_holds_the_fence_only_briefly(store: Store) -> None:
    """A node cut off between a statement and its COMMIT (a reap) leaves its backend idle in a
    transaction with FOR SHARE on the fence rows. The server ends that transaction after the
    idle-in-transaction timeout, so a successor's fence write waits about that long, not until
    the network heals (keepalives cannot tell: a proxy or a partition keeps the socket up)."""
    assert await store.take_fence(5, 10, "cid", "old") is not None
    loop = asyncio.get_running_loop()
    async with store.pool.acquire() as stuck:
        await stuck.execute("BEGIN")
        await stuck.fetch("SELECT token FROM partition_fences WHERE partition = 5 FOR SHARE")
        started = loop.time()
        fence = await store.take_fence(5, 11, "cid", "new")  # blocked by the stuck FOR SHARE
        waited = loop.time() - started
        assert fence is not None and fence.token == 11 and fence.owner == "new"
        assert IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 * 0.8 < waited < 5, waited
        with pytest.raises(StoreUnavailable):
            with _translated():  # the stuck node learns it when it speaks again
                await stuck.execute("COMMIT")


async def test_queue_depth_reads_ready_and_running_through_their_partial_indexes(
    store: Store, clock: ManualClock
) -> None:
    """The depth poll counts READY and RUNNING through tasks_ready and tasks_leases, which
    hold those states only, never by reading the table (its finished history may be large);
    the counts are right."""
    now = clock.now()
    await store.submit([TaskSpec(queue="d", run_at=now) for _ in range(30)], now)
    await store.claim("default", ["d"], "w", 10, now)
    await store.submit([TaskSpec(queue="d", run_at=now + timedelta(seconds=30))], now)
    depth = await store.queue_depth(range(store.partitions), bucket_of(now) - 1, bucket_of(now) + 1)
    assert depth == {
        ("default", "d", "READY"): 20,
        ("default", "d", "RUNNING"): 10,
        ("default", "d", "SCHEDULED"): 1,
    }
    async with store.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        (plan_json,) = await conn.fetchrow(
            "EXPLAIN (FORMAT JSON) " + q("queue_depth"),
            list(range(store.partitions)),
            bucket_of(now) - 1,
            bucket_of(now) + 1,
        )
    nodes = _nodes(json.loads(plan_json)[0]["Plan"])
    used = {n.get("Index Name") for n in nodes}
    # RUNNING through either partial index that holds it (tasks_queue_states, the counts'
    # index, serves it as well as tasks_leases): an index of those states, never the table.
    assert "tasks_ready" in used and used & {"tasks_leases", "tasks_queue_states"}, used
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"]
