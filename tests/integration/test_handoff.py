"""The hand-off: the wheel fires a task straight to a worker stream waiting on this node
(SCHEDULED → RUNNING in one fenced write), within the stream's credits, never early, never
for a queue with a dispatch limit; the store statement skips and fences as the plain fire
does (real node, real PostgreSQL, ManualClock wherever "not early" is asserted)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.coordinator.local import LocalOwnership
from chronoq.models import MisfirePolicy, TaskSpec, TaskState
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory
from tests.integration.test_precise_firing import LONG_TICK, _after_first_tick, _eventually
from tests.integration.test_work_stream import RawStream

pytestmark = pytest.mark.timeout(90)


async def _stream(node: Node, queue: str, credits: int) -> RawStream:
    stream = RawStream(node)
    await stream.open([queue], credits=credits, worker_id="w-handoff")
    # The stream's first claim read the queue limits and found nothing: it waits.
    await asyncio.sleep(0.3)
    return stream


async def test_a_due_task_goes_straight_to_a_waiting_stream_never_early(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock, tick=LONG_TICK)
    _, precise = await _after_first_tick(node)
    stream = await _stream(node, "h", credits=5)
    try:
        async with Client(node.address) as client:
            sub = await client.submit("h", delay=timedelta(milliseconds=500))
        clock.advance(timedelta(milliseconds=499))
        precise.poke()
        await asyncio.sleep(0.4)
        assert stream.responses.empty()  # 1 ms early: neither fired nor pushed
        clock.advance(timedelta(milliseconds=1))
        precise.poke()
        (pushed,) = await stream.tasks(1)
    finally:
        await stream.close()
    assert pushed.id == sub.task.id and pushed.attempt == 1 and pushed.worker_id == "w-handoff"
    task = await store.get(sub.task.id, "default")
    assert task.state is TaskState.RUNNING and task.attempt == 1
    assert task.fired_at is not None and task.fired_at >= task.run_at
    assert task.lease_until is not None and task.lease_until > task.fired_at
    assert precise.stats.handed_off == 1 and precise.stats.fired == 1


async def test_a_hand_off_stays_within_credits_and_the_rest_goes_ready(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(clock=clock, tick=LONG_TICK)
    _, precise = await _after_first_tick(node)
    stream = await _stream(node, "c", credits=2)
    try:
        async with Client(node.address) as client:
            subs = await client.submit_many(
                [NewTask(queue="c", delay=timedelta(milliseconds=300)) for _ in range(5)]
            )
        clock.advance(timedelta(milliseconds=300))
        precise.poke()
        pushed = await stream.tasks(2)
        await _eventually(lambda: precise.stats.fired == 5)
        await asyncio.sleep(0.3)
        assert stream.responses.empty()  # no credit left: nothing more pushed
        states = [(await store.get(s.task.id, "default")).state for s in subs]
        assert sorted(states) == sorted([TaskState.RUNNING] * 2 + [TaskState.READY] * 3)
        assert precise.stats.handed_off == 2
        await stream.send(credits=3)  # the rest comes by the stream's claim
        rest = await stream.tasks(3)
    finally:
        await stream.close()
    assert {t.id for t in pushed + rest} == {s.task.id for s in subs}


async def test_a_queue_with_a_dispatch_limit_is_never_handed_off(
    make_node: NodeFactory, clock: ManualClock
) -> None:
    node = await make_node(clock=clock, tick=LONG_TICK)
    _, precise = await _after_first_tick(node)
    async with Client(node.address) as client:
        await client.set_queue_limit("lim", rate=1000, burst=1000)
        stream = await _stream(node, "lim", credits=5)
        try:
            await client.submit("lim", delay=timedelta(milliseconds=200))
            clock.advance(timedelta(milliseconds=200))
            precise.poke()
            (task,) = await stream.tasks(1)  # by a claim that took a token
        finally:
            await stream.close()
    assert task.attempt == 1
    assert precise.stats.handed_off == 0 and precise.stats.fired == 1


async def test_the_leasing_fire_skips_misfires_and_is_fenced(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    late = TaskSpec(
        queue="m",
        run_at=now - timedelta(seconds=30),
        misfire_policy=MisfirePolicy.SKIP,
        misfire_grace=timedelta(seconds=1),
    )
    fine = TaskSpec(queue="m", run_at=now)
    ids = [o.task.id for o in await store.submit([late, fine], now - timedelta(minutes=1))]
    old = LocalOwnership(store, "old")
    await old.start()
    stale = dict(old.owned())
    new = LocalOwnership(store, "new")
    await new.start()  # bumps every token
    leases = {i: "w" for i in ids}
    fenced = await store.fire_listed(stale, now, ids, leases=leases)
    assert fenced.fired == 0 and fenced.leased == []
    result = await store.fire_listed(new.owned(), now, ids, leases=leases)
    assert result.skipped == 1 and result.fired == 1
    assert [t.id for t in result.leased] == [ids[1]]  # the misfire was skipped, not leased
    assert not result.ready_by_queue  # the leased one is not READY for anyone else
    skipped, leased = [await store.get(i, "default") for i in ids]
    assert skipped.state is TaskState.SKIPPED and skipped.attempt == 0
    assert leased.state is TaskState.RUNNING and leased.worker_id == "w" and leased.attempt == 1


async def test_a_stream_out_of_credit_passes_a_notice_on(
    make_node: NodeFactory, clock: ManualClock
) -> None:
    # The store re-check (claim_poll) far beyond the test: only a passed-on notice explains it.
    node = await make_node(clock=clock, tick=LONG_TICK, claim_poll=timedelta(seconds=30))
    _, precise = await _after_first_tick(node)
    first = await _stream(node, "n", credits=1)  # the oldest waiter of the queue
    second = await _stream(node, "n", credits=1)
    try:
        async with Client(node.address) as client:
            due = await client.submit("n", delay=timedelta(milliseconds=200))
            clock.advance(timedelta(milliseconds=200))
            precise.poke()
            (handed,) = await first.tasks(1)  # the hand-off took its last credit
            assert handed.id == due.task.id
            # READY now (a batch: a single submit would be leased to the waiting stream by
            # its insert): wakes a waiter of this node.
            (ready,) = await client.submit_many([NewTask(queue="n")])
            loop = asyncio.get_running_loop()
            started = loop.time()
            (claimed,) = await second.tasks(1, timeout=10)
            waited = loop.time() - started
    finally:
        await first.close()
        await second.close()
    assert precise.stats.handed_off == 1
    assert claimed.id == ready.task.id
    assert waited < 2.5, f"the notice waited {waited:.1f} s for a re-check"  # not STREAM_WAIT


async def test_a_hand_off_whose_outcome_is_unknown_is_given_back(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    (sub,) = await store.submit([TaskSpec(queue="u", run_at=now)], now - timedelta(seconds=5))
    owner = LocalOwnership(store, "n")
    await owner.start()
    result = await store.fire_listed(owner.owned(), now, [sub.task.id], leases={sub.task.id: "w"})
    assert [t.id for t in result.leased] == [sub.task.id]
    # Another worker's claim of another attempt is never touched: the worker must match.
    assert not await store.release_handed({sub.task.id: "other"}, now, now)
    ready = await store.release_handed({sub.task.id: "w"}, now, now)
    assert ready == {("default", "u"): 1}
    task = await store.get(sub.task.id, "default")
    assert task.state is TaskState.READY and task.worker_id is None
    (again,) = await store.claim("default", ["u"], "w2", 1, now)
    assert again.attempt - again.retry_base == 1  # the given-back attempt was not used
