"""Task lifecycle through the gRPC API of a real node on real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from chronoq import errors
from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.models import Lease, TaskState
from chronoq.node import Node

pytestmark = pytest.mark.timeout(60)


async def wait_state(client: Client, task_id: str, state: TaskState, timeout: float = 5) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (current := (await client.get(task_id)).state) is not state:
        assert asyncio.get_running_loop().time() < deadline, (
            f"still {current.name}, wanted {state.name}"
        )
        await asyncio.sleep(0.02)


async def fire(node: Node) -> None:
    assert node.firer is not None
    await node.firer.tick()


async def test_full_lifecycle_and_refusals(node: Node, client: Client, clock: ManualClock) -> None:
    sub = await client.submit("mail", delay=timedelta(seconds=30), payload=b"hi")
    task = sub.task
    assert task.state is TaskState.SCHEDULED and task.attempt == 0
    assert await client.claim(["mail"]) == []  # not due yet: nothing to claim

    clock.advance(timedelta(seconds=31))
    await fire(node)
    assert (await client.get(task.id)).state is TaskState.READY

    (claimed,) = await client.claim(["mail"], worker_id="w1")
    assert claimed.id == task.id and claimed.state is TaskState.RUNNING and claimed.attempt == 1
    assert claimed.worker_id == "w1" and claimed.payload == b"hi"

    (beat,) = await client.heartbeat([Lease(task.id, 1)])
    assert beat.ok and not beat.cancelled

    done = await client.complete(Lease(task.id, 1))
    assert done.state is TaskState.SUCCEEDED and done.finished_at is not None

    assert await client.complete(Lease(task.id, 1)) == done  # a second complete: same answer
    with pytest.raises(errors.PreconditionFailed, match="SUCCEEDED"):
        await client.complete(Lease(task.id, 2))  # but not for another attempt's token
    with pytest.raises(errors.PreconditionFailed, match="cannot cancel"):
        await client.cancel(task.id)
    (late,) = await client.heartbeat([Lease(task.id, 1)])
    assert not late.ok and "SUCCEEDED" in late.error


async def test_idempotent_submit_returns_the_first_task(client: Client) -> None:
    first = await client.submit(
        "q", delay=timedelta(minutes=5), idempotency_key="order-42", payload=b"1"
    )
    again = await client.submit(
        "q", delay=timedelta(minutes=9), idempotency_key="order-42", payload=b"2"
    )
    assert first.created and not again.created
    assert again.task.id == first.task.id and again.task.payload == b"1"
    assert again.task.run_at == first.task.run_at

    batch = await client.submit_many(
        [
            NewTask(queue="q", idempotency_key="order-42"),
            NewTask(queue="q", idempotency_key="new"),
            NewTask(queue="q", idempotency_key="new"),
        ]
    )
    assert [b.created for b in batch] == [False, True, False]
    assert batch[0].task.id == first.task.id and batch[1].task.id == batch[2].task.id

    other_ns = Client(client.target, namespace="tenant-b")
    try:
        elsewhere = await other_ns.submit("q", idempotency_key="order-42")
        assert elsewhere.created and elsewhere.task.id != first.task.id
    finally:
        await other_ns.close()


async def test_concurrent_claimers_never_share_a_task(node: Node, client: Client) -> None:
    subs = await client.submit_many([NewTask(queue="c") for _ in range(600)])  # due now: READY
    assert all(s.task.state is TaskState.READY for s in subs)
    clients = [Client(node.address) for _ in range(6)]
    try:

        async def drain(c: Client, name: str) -> list[str]:
            got: list[str] = []
            while batch := await c.claim(["c"], worker_id=name, max_tasks=7):
                got.extend(t.id for t in batch)
            return got

        results = await asyncio.gather(*(drain(c, f"w{i}") for i, c in enumerate(clients)))
    finally:
        for c in clients:
            await c.close()
    claimed = [tid for r in results for tid in r]
    assert len(claimed) == len(set(claimed)) == 600
    assert set(claimed) == {s.task.id for s in subs}
    assert sum(1 for r in results if r) > 1  # the claimers really competed


async def test_expired_lease_is_redelivered_with_next_attempt(
    node: Node, client: Client, clock: ManualClock
) -> None:
    sub = await client.submit(
        "r",
        lease_timeout=timedelta(seconds=2),
        backoff_initial=timedelta(0),
        backoff_max=timedelta(0),
    )
    (first,) = await client.claim(["r"], worker_id="dies")
    assert first.attempt == 1
    clock.advance(timedelta(seconds=3))  # the worker stopped heartbeating
    assert node.reaper is not None
    reaped = await node.reaper.reap()
    assert [t.id for t in reaped] == [sub.task.id]
    assert "lease expired" in (reaped[0].last_error or "")
    (second,) = await client.claim(["r"], worker_id="lives")
    assert second.id == sub.task.id and second.attempt == 2
    with pytest.raises(errors.PreconditionFailed, match="stale"):
        await client.complete(Lease(sub.task.id, 1))  # the old worker wakes up: refused
    assert (await client.complete(Lease(sub.task.id, 2))).state is TaskState.SUCCEEDED


async def test_heartbeat_extends_the_lease(node: Node, client: Client, clock: ManualClock) -> None:
    await client.submit("h", lease_timeout=timedelta(seconds=10))
    (task,) = await client.claim(["h"])
    assert task.lease_until == clock.now() + timedelta(seconds=10)
    clock.advance(timedelta(seconds=8))
    (beat,) = await client.heartbeat([Lease(task.id, 1)])
    assert beat.ok
    assert (await client.get(task.id)).lease_until == clock.now() + timedelta(seconds=10)
    clock.advance(timedelta(seconds=8))  # 16 s after the claim, 8 after the heartbeat
    assert node.reaper is not None
    assert await node.reaper.reap() == []


async def test_retries_back_off_then_end_dead(
    node: Node, client: Client, clock: ManualClock
) -> None:
    sub = await client.submit(
        "flaky",
        max_attempts=3,
        backoff_initial=timedelta(seconds=10),
        backoff_max=timedelta(seconds=15),
    )
    tid = sub.task.id
    expected_caps = [10, 15]
    for attempt in (1, 2):
        (task,) = await client.claim(["flaky"])
        assert task.attempt == attempt
        failed = await client.fail(Lease(tid, attempt), f"boom {attempt}")
        assert failed.state is TaskState.SCHEDULED and failed.last_error == f"boom {attempt}"
        delay = (failed.run_at - clock.now()).total_seconds()
        cap = expected_caps[attempt - 1]
        assert cap / 2 <= delay <= cap, delay  # exponential, capped, with jitter
        assert await client.claim(["flaky"]) == []  # backing off
        clock.advance(timedelta(seconds=cap + 1))
        await fire(node)
    (task,) = await client.claim(["flaky"])
    dead = await client.fail(Lease(tid, 3), "boom 3")
    assert dead.state is TaskState.DEAD and dead.last_error == "boom 3" and dead.attempt == 3

    page = await client.list(dead=True)
    assert [t.id for t in page.tasks] == [tid]

    (requeued,) = await client.requeue([tid])
    assert requeued.state is TaskState.READY
    (again,) = await client.claim(["flaky"])
    assert again.attempt == 4
    retried = await client.fail(Lease(tid, 4), "boom 4")
    assert retried.state is TaskState.SCHEDULED  # a fresh budget of 3 attempts after requeue


async def test_fatal_failure_goes_dead_at_once(client: Client) -> None:
    sub = await client.submit("f", max_attempts=5)
    await client.claim(["f"])
    dead = await client.fail(Lease(sub.task.id, 1), "bad payload", fatal=True)
    assert dead.state is TaskState.DEAD and dead.attempt == 1


async def test_a_dead_letter_can_be_discarded_but_a_finished_task_cannot(client: Client) -> None:
    sub = await client.submit("discard", max_attempts=1)
    await client.claim(["discard"])
    await client.fail(Lease(sub.task.id, 1), "no", fatal=True)
    discarded = await client.cancel(sub.task.id)
    assert discarded.state is TaskState.CANCELLED and discarded.last_error == "no"
    assert sub.task.id not in {t.id for t in (await client.list(state=TaskState.DEAD)).tasks}

    done = await client.submit("discard")
    await client.claim(["discard"])
    await client.complete(Lease(done.task.id, 1))
    with pytest.raises(errors.PreconditionFailed):
        await client.cancel(done.task.id)


async def test_cancel(node: Node, client: Client, clock: ManualClock) -> None:
    scheduled = await client.submit("x", delay=timedelta(minutes=1))
    ready = await client.submit("x")
    running = await client.submit("y")
    (claimed,) = await client.claim(["y"])

    for sub in (scheduled, ready):
        assert (await client.cancel(sub.task.id)).state is TaskState.CANCELLED
    assert (await client.cancel(running.task.id)).state is TaskState.CANCELLED

    (beat,) = await client.heartbeat([Lease(claimed.id, 1)])
    assert beat.cancelled and not beat.ok  # the worker learns it should stop
    with pytest.raises(errors.PreconditionFailed, match="cancelled"):
        await client.complete(Lease(claimed.id, 1))

    clock.advance(timedelta(minutes=2))
    await fire(node)
    assert (await client.get(scheduled.task.id)).state is TaskState.CANCELLED  # never fires
    assert await client.claim(["x", "y"]) == []


async def test_priority_orders_ready_tasks(client: Client) -> None:
    low = await client.submit("p", priority=0)
    high = await client.submit("p", priority=10)
    first, second = await client.claim(["p"], max_tasks=2)
    assert (first.id, second.id) == (high.task.id, low.task.id)


async def test_long_poll_wakes_when_a_task_fires(
    node: Node, client: Client, clock: ManualClock
) -> None:
    await client.submit("lp", delay=timedelta(seconds=5))
    loop = asyncio.get_running_loop()
    started = loop.time()
    claim = asyncio.create_task(client.claim(["lp"], wait=timedelta(seconds=10)))
    await asyncio.sleep(0.2)
    assert not claim.done()
    clock.advance(timedelta(seconds=6))
    (task,) = await claim
    assert task.attempt == 1 and loop.time() - started < 5


async def test_list_paginates_and_filters(client: Client) -> None:
    subs = await client.submit_many(
        [NewTask(queue="a", delay=timedelta(hours=1)) for _ in range(7)] + [NewTask(queue="b")]
    )
    ids: list[str] = []
    token = ""
    while True:
        page = await client.list(queue="a", page_size=3, page_token=token)
        ids += [t.id for t in page.tasks]
        if not page.next_token:
            break
        token = page.next_token
    assert sorted(ids) == sorted(s.task.id for s in subs[:7])
    ready = await client.list(state=TaskState.READY)
    assert [t.id for t in ready.tasks] == [subs[7].task.id]


async def test_claim_never_exceeds_max_tasks(client: Client) -> None:
    await client.submit_many([NewTask(queue="lim") for _ in range(50)])
    sizes = []
    while batch := await client.claim(["lim"], max_tasks=3):
        sizes.append(len(batch))
    assert sum(sizes) == 50 and max(sizes) == 3


async def test_bulk_submit_answers_with_ids(client: Client) -> None:
    first = await client.submit("bulk", idempotency_key="dup")
    got = await client.submit_ids(
        [NewTask(queue="bulk", idempotency_key="dup"), NewTask(queue="bulk", delay=timedelta(hours=1))]
    )
    assert got[0] == (first.task.id, False)
    fresh_id, created = got[1]
    assert created and (await client.get(fresh_id)).state is TaskState.SCHEDULED


async def test_claim_across_queues_takes_priority_then_age(
    client: Client, clock: ManualClock
) -> None:
    a_old = await client.submit("qa", priority=1)
    clock.advance(timedelta(seconds=1))
    b_high = await client.submit("qb", priority=5)
    a_new = await client.submit("qa", priority=1)
    clock.advance(timedelta(seconds=1))
    got = await client.claim(["qa", "qb"], max_tasks=3)
    assert [t.id for t in got] == [b_high.task.id, a_old.task.id, a_new.task.id]
