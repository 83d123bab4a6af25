"""Contract: a queue's dispatch limit holds across concurrent claims, and a hand-off (firing
straight to a worker's lease) is fenced and can be given back."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from chronoq.errors import NamespaceCapReached
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)

LIMITED = frozenset({("default", "lim")})


async def test_a_queue_limit_bounds_claims_even_concurrent_ones(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.submit([TaskSpec(queue="lim", run_at=now) for _ in range(30)], now)
    await store_shape.set_queue_limit("default", "lim", 1.0, 5.0, now, cap=10)
    assert await store_shape.queue_limits() == {("default", "lim"): (1.0, 5.0)}
    batches = await asyncio.gather(
        *(
            store_shape.claim("default", ["lim"], f"w{i}", 10, now, limited=LIMITED)
            for i in range(4)
        )
    )
    assert sum(len(b) for b in batches) == 5  # the burst, shared, never more
    assert await store_shape.claim("default", ["lim"], "w", 10, now, limited=LIMITED) == []
    later = now + timedelta(seconds=2)  # two tokens refilled
    assert len(await store_shape.claim("default", ["lim"], "w", 10, later, limited=LIMITED)) == 2
    # Unlimited claims of the queue (a claim that does not pass ``limited``) are not bounded.
    assert len(await store_shape.claim("default", ["lim"], "w", 3, later)) == 3


async def test_unused_tokens_are_given_back(store_shape: TaskStore, now: datetime) -> None:
    await store_shape.set_queue_limit("default", "lim", 0.001, 4.0, now, cap=10)
    await store_shape.submit([TaskSpec(queue="lim", run_at=now)], now)
    assert len(await store_shape.claim("default", ["lim"], "w", 4, now, limited=LIMITED)) == 1
    await store_shape.submit([TaskSpec(queue="lim", run_at=now) for _ in range(9)], now)
    # One token was used; the three the first claim did not use are there still.
    assert len(await store_shape.claim("default", ["lim"], "w", 9, now, limited=LIMITED)) == 3


async def test_limits_are_capped_per_namespace_and_removed_by_rate_zero(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.set_queue_limit("default", "a", 1.0, 1.0, now, cap=1)
    with pytest.raises(NamespaceCapReached):
        await store_shape.set_queue_limit("default", "b", 1.0, 1.0, now, cap=1)
    await store_shape.set_queue_limit("default", "a", 2.0, 4.0, now, cap=1)  # a change: allowed
    await store_shape.set_queue_limit("other", "b", 1.0, 1.0, now, cap=1)  # caps per namespace
    assert await store_shape.queue_limits() == {
        ("default", "a"): (2.0, 4.0),
        ("other", "b"): (1.0, 1.0),
    }
    await store_shape.set_queue_limit("default", "a", 0.0, 0.0, now, cap=1)
    assert await store_shape.queue_limits() == {("other", "b"): (1.0, 1.0)}


async def test_a_hand_off_leases_owned_due_tasks_and_can_be_given_back(
    store_shape: TaskStore, now: datetime
) -> None:
    out = await store_shape.submit(
        [TaskSpec(queue="h", run_at=now + timedelta(seconds=5)) for _ in range(6)], now
    )
    tasks = [o.task for o in out]
    owned = {}
    for p in range(PARTITIONS):
        assert await store_shape.take_fence(p, 4, "contract", "me") is not None
        owned[p] = 4
    leases = {t.id: "w1" for t in tasks[:3]}
    ids = [t.id for t in tasks]
    early = await store_shape.fire_listed(owned, now, ids, leases=leases)
    assert early.fired == 0 and early.leased == []  # not due yet: never early
    at = now + timedelta(seconds=5)
    stale = {p: 3 for p in owned}
    assert (await store_shape.fire_listed(stale, at, ids, leases=leases)).fired == 0

    result = await store_shape.fire_listed(owned, at, ids, leases=leases, node_id="me")

    assert result.fired == 6
    assert sorted(t.id for t in result.leased) == sorted(leases)
    for t in result.leased:
        assert t.state is TaskState.RUNNING and t.worker_id == "w1" and t.attempt == 1
    assert sum(result.ready_by_queue.values()) == 3  # the others fired READY
    # The hand-off's outcome was lost: its leases go back to READY, counted by queue.
    given = await store_shape.release_handed(leases, at, at)
    assert given == {("default", "h"): 3}
    for t in tasks[:3]:
        assert (await store_shape.get(t.id, "default")).state is TaskState.READY
    (again,) = await store_shape.heartbeat("default", [Lease(tasks[0].id, 1)], at)
    assert not again.ok  # the given-back lease is no longer current


async def test_a_due_submit_can_be_leased_by_its_own_insert(
    store_shape: TaskStore, now: datetime
) -> None:
    spec = TaskSpec(queue="s", run_at=now, idempotency_key="k-leased")
    first = await store_shape.submit_leased(spec, now, "w1")
    task = first.task
    assert first.created and task.state is TaskState.RUNNING
    assert task.attempt == 1 and task.worker_id == "w1"
    assert task.lease_until == now + task.lease_timeout  # leased at the insert's instant
    # A repeated key answers its first task, not created and not leased again.
    again = await store_shape.submit_leased(spec, now, "w2")
    assert not again.created and again.task.id == task.id and again.task.worker_id == "w1"
    # Given back (the push failed): READY, and the next claim's attempt is its first.
    await store_shape.release("default", Lease(task.id, 1))
    (claimed,) = await store_shape.claim("default", ["s"], "w3", 1, now)
    assert claimed.id == task.id and claimed.attempt - claimed.retry_base == 1


async def test_a_submit_is_not_leased_past_a_ready_task_a_claim_takes_first(
    store_shape: TaskStore, now: datetime
) -> None:
    (head,) = await store_shape.submit([TaskSpec(queue="o", run_at=now, priority=5)], now)
    low = await store_shape.submit_leased(TaskSpec(queue="o", run_at=now, priority=4), now, "w")
    assert low.created and low.task.state is TaskState.READY and low.task.worker_id is None
    high = await store_shape.submit_leased(TaskSpec(queue="o", run_at=now, priority=6), now, "w")
    assert high.task.state is TaskState.RUNNING  # nothing READY would be claimed before it
    with pytest.raises(ValueError, match="due at once"):
        await store_shape.submit_leased(
            TaskSpec(queue="o", run_at=now + timedelta(seconds=1)), now, "w"
        )
    claimed = await store_shape.claim("default", ["o"], "w", 5, now)
    assert [t.id for t in claimed] == [head.task.id, low.task.id]
