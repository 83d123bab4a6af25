"""Precise firing through the owner's timing wheel, on a real PostgreSQL (and etcd).

The tick is set far beyond each test's length, so what fires was fired by the wheel; the
clock is a ManualClock wherever "not early" is asserted, so no assertion rests on timing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from chronoq.buckets import bucket_of
from chronoq.client import Client
from chronoq.clock import ManualClock
from chronoq.coordinator.local import LocalOwnership
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.node import Node
from chronoq.node.owner.firing import Firer
from chronoq.node.owner.precise import PreciseFirer
from chronoq.routing import id_partition
from chronoq.store import Store
from chronoq.store.sql import q
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled
from tests.integration.test_firing import _examined, _nodes

pytestmark = pytest.mark.timeout(90)

LONG_TICK = timedelta(seconds=60)  # no catch-all tick runs after the first during a test


async def _state(store: Store, task_id: str) -> TaskState:
    return (await store.get(task_id, "default")).state


async def _until_ready(store: Store, task_id: str, within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while await _state(store, task_id) is TaskState.SCHEDULED:
        assert loop.time() < deadline, f"task {task_id} never fired"
        await asyncio.sleep(0.02)


async def _eventually(condition: Callable[[], bool], within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        if condition():
            return
        assert loop.time() < deadline, "condition never met"
        await asyncio.sleep(0.01)


async def _after_first_tick(node: Node) -> tuple[Firer, PreciseFirer]:
    firer, precise = node.firer, node.owner.wheel
    assert firer is not None and precise is not None
    await _eventually(lambda: firer.stats.ticks > 0)  # the first tick runs at start
    return firer, precise


async def test_a_near_future_submit_fires_at_its_instant_and_never_early(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock, tick=LONG_TICK)
    firer, precise = await _after_first_tick(node)
    ticks = firer.stats.ticks
    async with Client(node.address) as client:
        sub = await client.submit("p", delay=timedelta(milliseconds=500))
    task_id = sub.task.id
    assert task_id in precise.wheel  # entered at submit, not at the next load
    clock.advance(timedelta(milliseconds=499))
    precise.poke()
    await asyncio.sleep(0.5)  # the fire loop looked at the clock meanwhile
    assert await _state(store, task_id) is TaskState.SCHEDULED  # 1 ms early: not fired
    clock.advance(timedelta(milliseconds=1))
    precise.poke()
    await _until_ready(store, task_id)
    assert firer.stats.ticks == ticks, "a tick ran: the assertion would prove nothing"
    assert precise.stats.fired == 1 and firer.stats.fired == 1
    assert firer.lateness.max >= 0  # counted like the tick's fires


async def test_loads_follow_a_clock_that_jumps_both_ways(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock, tick=LONG_TICK, wheel_horizon=timedelta(seconds=2))
    firer, precise = await _after_first_tick(node)
    ticks = firer.stats.ticks
    now = clock.now()
    # Submitted straight to the store: only a load can bring them into the wheel.
    specs = [TaskSpec(queue="j", run_at=now + timedelta(seconds=10 + 3 * i)) for i in range(3)]
    ids = [o.task.id for o in await store.submit(specs, now)]
    await precise.load()
    assert not any(i in precise.wheel for i in ids)  # beyond the horizon
    clock.advance(timedelta(seconds=9))  # the first is 1 s away
    precise.poke()
    await precise.load()
    assert ids[0] in precise.wheel and ids[1] not in precise.wheel
    clock.advance(timedelta(seconds=-5))  # back: 6 s away, nothing due
    precise.poke()
    await asyncio.sleep(0.4)
    assert await _state(store, ids[0]) is TaskState.SCHEDULED
    clock.advance(timedelta(seconds=6))  # due now
    precise.poke()
    await _until_ready(store, ids[0])
    assert await _state(store, ids[1]) is TaskState.SCHEDULED
    assert firer.stats.ticks == ticks


async def test_a_stale_owner_fires_nothing_from_its_wheel(
    store: Store, clock: ManualClock, dsn: str
) -> None:
    now = clock.now()
    outcomes = await store.submit(
        [TaskSpec(queue="f", run_at=now + timedelta(seconds=1)) for _ in range(20)], now
    )
    old = LocalOwnership(store, "old")
    await old.start()
    firer = Firer(store, old, clock, tick=60, batch=100, rounds=1, node_id="old")
    precise = PreciseFirer(
        store,
        old,
        clock,
        firer.account,
        partitions=old.partitions,
        horizon=timedelta(seconds=2),
        capacity=100,
        node_id="old",
    )
    assert await precise.load() == 20
    new = LocalOwnership(store, "new")
    await new.start()  # bumps every token: "old" is fenced, though it still believes it owns
    clock.advance(timedelta(seconds=2))
    await precise.fire()
    assert precise.stats.statements >= 1 and precise.stats.fired == 0
    assert all([await _state(store, o.task.id) is TaskState.SCHEDULED for o in outcomes])
    # The same statement with the current tokens fires them.
    ids = [o.task.id for o in outcomes]
    assert (await store.fire_listed(new.owned(), clock.now(), ids)).fired == 20
    # And never before run_at, whatever the caller asks: the statement checks it too.
    later = await store.submit([TaskSpec(queue="f", run_at=clock.now() + timedelta(seconds=5))],
                               clock.now())
    early = await store.fire_listed(new.owned(), clock.now(), [later[0].task.id])
    assert early.fired == 0


async def test_the_wheel_drops_what_it_holds_when_ownership_moves(
    make_node: NodeFactory, etcd: Any, cluster_name: str, store: Store
) -> None:
    settings = cluster(etcd, cluster_name)
    wide = timedelta(seconds=20)
    first = await make_node(cluster=settings, node_id="n0", tick=LONG_TICK, wheel_horizon=wide)
    await settled([first])
    assert first.owner.wheel is not None
    async with Client(first.address) as client:
        for _ in range(40):
            await client.submit("o", delay=timedelta(seconds=40))  # beyond the horizon
        subs = [await client.submit("o", delay=timedelta(seconds=8)) for _ in range(40)]
    held = {s.task.id for s in subs} & set(first.owner.wheel.wheel._entries)
    assert held, "near-future submits should be in the owner's wheel"
    second = await make_node(cluster=settings, node_id="n1", tick=LONG_TICK, wheel_horizon=wide)
    owners = await settled([first, second])
    lost = {p for p, n in owners.items() if n == "n1"}
    assert lost
    assert not first.owner.wheel.wheel.partitions() & lost  # dropped when they moved
    assert first.owner.wheel.wheel.partitions() <= set(first.ownership.owned())  # type: ignore[union-attr]
    for s in subs:  # every one fires once, by whichever node owns it now
        await _until_ready(store, s.task.id)
    fired_by = {(await store.get(s.task.id, "default")).fired_by for s in subs}
    assert fired_by <= {"n0", "n1"}


async def test_a_near_future_submit_on_another_node_reaches_the_owner_s_wheel(
    make_node: NodeFactory, etcd: Any, cluster_name: str, store: Store
) -> None:
    settings = cluster(etcd, cluster_name)
    nodes = [await make_node(cluster=settings, node_id=f"n{i}", tick=LONG_TICK) for i in range(2)]
    owners = await settled(nodes)
    for n in nodes:
        await _after_first_tick(n)
        soon = n.owner.soon
        assert soon is not None
        await _eventually(lambda: soon.listening)  # noqa: B023 - awaited right here
    async with Client(nodes[0].address) as client:
        subs = [await client.submit("n", delay=timedelta(milliseconds=800)) for _ in range(30)]
    remote = [s for s in subs if owners[partition_of_task(s.task.id)] == "n1"]
    assert remote, "some tasks should belong to the other node"
    for s in subs:
        await _until_ready(store, s.task.id)
    assert nodes[1].owner.soon is not None and nodes[1].owner.soon.heard >= 1
    assert nodes[1].owner.wheel is not None and nodes[1].owner.wheel.stats.offered >= 1
    # Every one fired by a wheel (a tick's fires are not counted there). Partitions may move
    # as the loads change; the wheel of the new owner then reads them again.
    assert sum(n.owner.wheel.stats.fired for n in nodes if n.owner.wheel is not None) == len(subs)


def partition_of_task(task_id: str, partitions: int = 16) -> int:
    import uuid

    return id_partition(uuid.UUID(task_id), partitions)


async def test_a_task_fired_on_one_node_wakes_a_long_poll_on_another_without_a_recheck(
    make_node: NodeFactory, etcd: Any, cluster_name: str
) -> None:
    settings = cluster(etcd, cluster_name)
    nodes = [
        await make_node(
            cluster=settings, node_id=f"n{i}", tick=LONG_TICK, claim_poll=timedelta(seconds=60)
        )
        for i in range(2)
    ]
    owners = await settled(nodes)
    for n in nodes:
        broadcast = n.broadcast
        assert broadcast is not None
        await _eventually(lambda: broadcast.listening)  # noqa: B023 - awaited right here
    async with Client(nodes[0].address) as submitter, Client(nodes[1].address) as waiter:
        # A task of a partition node 0 owns, waited for on node 1: only a notice can tell it.
        while True:
            sub = await submitter.submit("w", delay=timedelta(milliseconds=600))
            if owners[partition_of_task(sub.task.id)] == "n0":
                break
            await submitter.cancel(sub.task.id)
        claim = asyncio.create_task(waiter.claim(["w"], wait=timedelta(seconds=50)))
        (claimed,) = await asyncio.wait_for(claim, 40)
    assert claimed.id == sub.task.id
    assert nodes[1].probe is not None and nodes[1].probe.probes == 0  # no re-check ran
    assert nodes[1].broadcast is not None and nodes[1].broadcast.heard >= 1


async def test_the_due_soon_read_examines_only_the_rows_coming_due(
    store: Store, clock: ManualClock
) -> None:
    """EXPLAIN ANALYZE of the wheel's load: one index range per (bucket, namespace) lane over
    the window, so rows examined = rows coming due, not the bucket's or the day's backlog."""
    now = clock.now()
    later = [TaskSpec(queue="e", run_at=now + timedelta(seconds=60 + i)) for i in range(5000)]
    await store.submit(later, now)
    same_bucket = await store.submit(
        [
            TaskSpec(
                queue="e",
                namespace="default" if s % 3 else "other",
                run_at=now + timedelta(milliseconds=100 * (s % 400) + 50),
            )
            for s in range(2000)
        ],
        now,
    )  # 40 s of tasks, 0.05 s to 40 s from now, in the current bucket
    target = same_bucket[0].task.partition
    until = now + timedelta(seconds=2)
    in_target = [o.task for o in same_bucket if o.task.partition == target]
    coming = [t for t in in_target if now < t.run_at <= until]
    assert coming and len(in_target) > 5 * len(coming)
    async with store.pool.acquire() as conn:
        await conn.execute("ANALYZE tasks")
        (plan_json,) = await conn.fetchrow(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + q("due_soon"),
            [target],
            bucket_of(now),
            bucket_of(until),
            now,
            until,
            10_000,
            64,
        )
    scans = [
        n for n in _nodes(json.loads(plan_json)[0]["Plan"]) if n.get("Index Name") == "tasks_due"
    ]
    ranges = [s for s in scans if "run_at" in s.get("Index Cond", "")]
    assert ranges and all(s["Node Type"] in ("Index Scan", "Index Only Scan") for s in ranges)
    assert sum(_examined(s) for s in ranges) == len(coming)
    rows = await store.due_soon([target], now, until, limit=10_000)
    assert sorted(r[0] for r in rows) == sorted(t.id for t in coming)


async def test_a_retry_after_a_short_backoff_enters_the_wheel(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    """A failed attempt's retry, and a reaped lease's, come due within the horizon: they
    fire from the wheel at their instant, not at the next catch-all tick."""
    node = await make_node(clock=clock, tick=LONG_TICK)
    _firer, precise = await _after_first_tick(node)
    async with Client(node.address) as client:
        await client.submit("r", backoff_initial=timedelta(milliseconds=300))
        await client.submit(
            "r", backoff_initial=timedelta(milliseconds=300), lease_timeout=timedelta(seconds=1)
        )
        failing, expiring = sorted(
            await client.claim(["r"], max_tasks=2), key=lambda t: t.lease_timeout, reverse=True
        )
        retried = await client.fail(
            Lease(failing.id, failing.attempt), "boom", retry_after=timedelta(milliseconds=300)
        )
    assert retried.state is TaskState.SCHEDULED and failing.id in precise.wheel
    clock.advance(timedelta(seconds=2))  # the second lease expired meanwhile
    assert node.reaper is not None
    (reaped,) = await node.reaper.reap()
    assert reaped.id == expiring.id and reaped.state is TaskState.SCHEDULED
    assert expiring.id in precise.wheel
    clock.advance(timedelta(milliseconds=400))
    precise.poke()
    await _until_ready(store, failing.id)
    await _until_ready(store, expiring.id)
    assert precise.stats.fired >= 2


async def test_with_the_wheel_on_the_tick_slows_to_the_catch_all_until_it_finds_a_late_task(
    store: Store, clock: ManualClock
) -> None:
    own = LocalOwnership(store, "n")
    await own.start()
    firer = Firer(store, own, clock, tick=0.1, batch=100, rounds=1, node_id="n", catch_all=5.0)
    assert firer._interval() == 0.1
    await firer.tick()
    assert firer._interval() == 5.0
    now = clock.now()
    await store.submit([TaskSpec(queue="c", run_at=now + timedelta(seconds=1))], now)
    clock.advance(timedelta(seconds=2))
    assert (await firer.tick()).fired == 1  # a second late: the wheel did not hold it
    assert firer._interval() == 0.1
    await firer.tick()
    assert firer._interval() == 5.0
    alone = Firer(store, own, clock, tick=0.1, batch=100, rounds=1, node_id="n")
    await alone.tick()
    assert alone._interval() == 0.1
