"""Contract: claims are atomic and leased, a lease's token is its attempt, and every worker
transition (heartbeat, complete, fail, release) and every reap honours that token."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest

from chronoq.errors import InvalidArgument, InvalidTransition, StaleLease
from chronoq.models import Lease, LeaseMiss, Task, TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)

LEASE = timedelta(seconds=30)


async def ready(
    store: TaskStore, now: datetime, n: int, queue: str = "w", **spec: Any
) -> list[Task]:
    out = await store.submit(
        [TaskSpec(queue=queue, run_at=now, lease_timeout=LEASE, **spec) for _ in range(n)],
        now,
    )
    return [o.task for o in out]


async def owner(store: TaskStore, token: int = 1) -> dict[int, int]:
    """Every partition, owned with ``token``."""
    owned = {}
    for p in range(PARTITIONS):
        assert await store.take_fence(p, token, "contract", "reaper") is not None
        owned[p] = token
    return owned


async def test_concurrent_claims_never_share_a_task(store_shape: TaskStore, now: datetime) -> None:
    submitted = await ready(store_shape, now, 120)
    batches = await asyncio.gather(
        *(store_shape.claim("default", ["w"], f"w{i}", 20, now) for i in range(8))
    )
    ids = [t.id for batch in batches for t in batch]
    assert len(ids) == len(set(ids))  # no task went to two claims
    for i, batch in enumerate(batches):
        for t in batch:
            assert t.state is TaskState.RUNNING and t.worker_id == f"w{i}"
    # Whatever the races left is still READY and claimable, once: every task exactly once.
    rest: list[Task] = []
    for _ in range(10):
        got = await store_shape.claim("default", ["w"], "last", 50, now)
        if not got:
            break
        rest += got
    assert sorted(ids + [t.id for t in rest]) == sorted(t.id for t in submitted)


async def test_a_claim_leases_with_the_attempt_as_token(
    store_shape: TaskStore, now: datetime
) -> None:
    (task,) = await ready(store_shape, now, 1, payload=b"p")
    assert await store_shape.claim("default", ["other"], "w", 5, now) == []  # not its queue
    assert await store_shape.claim("elsewhere", ["w"], "w", 5, now) == []  # not its namespace
    (got,) = await store_shape.claim("default", ["w"], "w1", 5, now)
    assert got.id == task.id and got.payload == b"p"
    assert got.attempt == 1 and got.lease_until == now + LEASE and got.worker_id == "w1"
    assert await store_shape.claim("default", ["w"], "w2", 5, now) == []  # leased: not again
    assert await store_shape.get(task.id, "default") == got


async def test_a_claim_stops_at_its_byte_budget(store_shape: TaskStore, now: datetime) -> None:
    """A claim's tasks fit the answer it is sent in; it always takes one, if any is ready."""
    await ready(store_shape, now, 5, payload=b"x" * 4000)
    got = await store_shape.claim("default", ["w"], "w", 5, now, max_bytes=9000)
    assert 1 <= len(got) <= 2
    (one,) = await store_shape.claim("default", ["w"], "w", 5, now, max_bytes=10)
    assert one.state is TaskState.RUNNING


async def test_a_claim_takes_higher_priority_first(store_shape: TaskStore, now: datetime) -> None:
    low = await ready(store_shape, now, 3, priority=0)
    high = await ready(store_shape, now, 2, priority=9)
    got = await store_shape.claim("default", ["w"], "w", 2, now)
    assert sorted(t.id for t in got) == sorted(t.id for t in high)
    assert len(await store_shape.claim("default", ["w"], "w", 9, now)) == len(low)


async def test_a_claim_spends_an_attempt_only_on_the_tasks_it_hands_out(
    store_shape: TaskStore, now: datetime
) -> None:
    """A claim over ready tasks on every partition (both shards of a store of shards) leases
    only what it answers: its tasks are at attempt 1, every other one is READY at attempt 0,
    not leased and given back behind the worker's back."""
    tasks = [t for prio in (0, 5, 9) for t in await ready(store_shape, now, 16, priority=prio)]
    assert {t.partition < PARTITIONS // 2 for t in tasks} == {True, False}  # both halves
    best = sorted(t.id for t in tasks if t.priority == 9)
    for i, n in enumerate((6, 6, 4)):
        got = await store_shape.claim("default", ["w"], f"w{i}", n, now)
        assert len(got) == n and all(t.attempt == 1 and t.priority == 9 for t in got)
    claimed = {t.id for t in await all_in(store_shape, TaskState.RUNNING)}
    rest = await all_in(store_shape, TaskState.READY)
    assert len(rest) == len(tasks) - 16
    assert {t.attempt for t in rest} == {0} and all(t.worker_id is None for t in rest)
    assert sorted(claimed) == best


async def all_in(store: TaskStore, state: TaskState) -> list[Task]:
    """Every task of ``default`` in ``state`` (a bounded walk of the listing)."""
    out: list[Task] = []
    token = ""
    for _ in range(100):
        page = await store.list_tasks("default", state=state, page_size=100, page_token=token)
        out += page.tasks
        token = page.next_token
        if not token:
            break
    return out


async def test_a_heartbeat_extends_only_a_current_lease(
    store_shape: TaskStore, now: datetime
) -> None:
    await ready(store_shape, now, 1)
    (task,) = await store_shape.claim("default", ["w"], "w", 1, now)
    later = now + timedelta(seconds=20)
    (beat,) = await store_shape.heartbeat("default", [Lease(task.id, 1)], later)
    assert beat.ok and not beat.cancelled
    assert (await store_shape.get(task.id, "default")).lease_until == later + LEASE
    (stale,) = await store_shape.heartbeat("default", [Lease(task.id, 0)], later)
    assert not stale.ok and stale.reason is LeaseMiss.STALE
    (ack,) = await store_shape.complete("default", [Lease(task.id, 2)], later)
    assert not ack.ok and ack.reason is LeaseMiss.STALE
    assert (await store_shape.get(task.id, "default")).state is TaskState.RUNNING


async def test_complete_is_final_and_safe_to_repeat(store_shape: TaskStore, now: datetime) -> None:
    await ready(store_shape, now, 1)
    (task,) = await store_shape.claim("default", ["w"], "w", 1, now)
    (ack,) = await store_shape.complete("default", [Lease(task.id, 1)], now)
    assert ack.ok
    done = await store_shape.get(task.id, "default")
    assert done.state is TaskState.SUCCEEDED and done.finished_at == now
    (again,) = await store_shape.complete("default", [Lease(task.id, 1)], now)
    assert again.ok  # an ack whose answer was lost, sent again
    (beat,) = await store_shape.heartbeat("default", [Lease(task.id, 1)], now)
    assert beat.reason is LeaseMiss.NOT_RUNNING
    with pytest.raises(StaleLease):
        await store_shape.fail("default", Lease(task.id, 1), "late", now)
    assert await store_shape.get(task.id, "default") == done


async def test_fail_retries_with_backoff_then_dead_letters(
    store_shape: TaskStore, now: datetime
) -> None:
    (task,) = await ready(store_shape, now, 1, max_attempts=2)
    (first,) = await store_shape.claim("default", ["w"], "w", 1, now)
    assert first.id == task.id
    retried = await store_shape.fail("default", Lease(task.id, 1), "boom", now)
    assert retried.state is TaskState.SCHEDULED and retried.run_at > now  # a backoff
    assert retried.last_error == "boom" and retried.attempt == 1
    assert await store_shape.claim("default", ["w"], "w", 1, now) == []  # not before its time

    owned = await owner(store_shape)
    fired = await store_shape.fire_due(owned, retried.run_at)
    assert fired.fired == 1
    (second,) = await store_shape.claim("default", ["w"], "w", 1, retried.run_at)
    assert second.attempt == 2
    with pytest.raises(StaleLease):  # the first attempt's token is spent
        await store_shape.fail("default", Lease(task.id, 1), "late", retried.run_at)
    dead = await store_shape.fail("default", Lease(task.id, 2), "boom again", retried.run_at)
    assert dead.state is TaskState.DEAD and dead.last_error == "boom again"
    page = await store_shape.list_tasks("default", state=TaskState.DEAD)
    assert [t.id for t in page.tasks] == [task.id]


async def test_a_fatal_failure_dead_letters_at_once(store_shape: TaskStore, now: datetime) -> None:
    await ready(store_shape, now, 1, max_attempts=5)
    (task,) = await store_shape.claim("default", ["w"], "w", 1, now)
    dead = await store_shape.fail("default", Lease(task.id, 1), "bad input", now, fatal=True)
    assert dead.state is TaskState.DEAD


async def test_retry_after_sets_the_next_run(store_shape: TaskStore, now: datetime) -> None:
    await ready(store_shape, now, 1)
    (task,) = await store_shape.claim("default", ["w"], "w", 1, now)
    wait = timedelta(minutes=7)
    retried = await store_shape.fail("default", Lease(task.id, 1), "busy", now, retry_after=wait)
    assert retried.state is TaskState.SCHEDULED and retried.run_at == now + wait


async def test_requeue_brings_dead_letters_back_all_or_none(
    store_shape: TaskStore, now: datetime
) -> None:
    await ready(store_shape, now, 3, max_attempts=1)
    claimed = await store_shape.claim("default", ["w"], "w", 3, now)
    for t in claimed[:2]:
        assert (await store_shape.fail("default", Lease(t.id, 1), "x", now)).state is TaskState.DEAD
    dead = [t.id for t in claimed[:2]]
    running = claimed[2].id
    with pytest.raises(InvalidArgument, match=running):  # names the task that is not DEAD
        await store_shape.requeue("default", [*dead, running], now)
    for i in dead:  # all or none: the refused requeue left the dead ones dead
        assert (await store_shape.get(i, "default")).state is TaskState.DEAD
    later = now + timedelta(minutes=1)
    back = await store_shape.requeue("default", dead, later)
    assert sorted(t.id for t in back) == sorted(dead)
    assert all(t.state is TaskState.READY for t in back)
    assert (await store_shape.list_tasks("default", state=TaskState.DEAD)).tasks == []
    # A fresh attempt budget: the requeued task can be claimed and fail once more into DEAD.
    again = await store_shape.claim("default", ["w"], "w", 5, later)
    assert sorted(t.id for t in again) == sorted(dead)


async def test_release_gives_a_task_back_without_using_an_attempt(
    store_shape: TaskStore, now: datetime
) -> None:
    (task,) = await ready(store_shape, now, 1, max_attempts=2)
    await store_shape.claim("default", ["w"], "w", 1, now)
    released = await store_shape.release("default", Lease(task.id, 1))
    assert released.state is TaskState.READY
    with pytest.raises(StaleLease):
        await store_shape.release("default", Lease(task.id, 1))  # not running any more
    (again,) = await store_shape.claim("default", ["w"], "w", 1, now)
    assert again.attempt == 2  # a new token
    # Two claims, one release: one attempt used, so a failure still retries.
    retried = await store_shape.fail("default", Lease(task.id, 2), "x", now)
    assert retried.state is TaskState.SCHEDULED


async def test_cancel_stops_waiting_ready_running_and_dead_tasks(
    store_shape: TaskStore, now: datetime
) -> None:
    (sub,) = await store_shape.submit([TaskSpec(queue="w", run_at=now + timedelta(hours=1))], now)
    waiting = sub.task
    await ready(store_shape, now, 3, max_attempts=1)
    running_t, dead_t, done_t = await store_shape.claim("default", ["w"], "w", 3, now)
    (free,) = await ready(store_shape, now, 1)  # READY, not claimed
    await store_shape.fail("default", Lease(dead_t.id, 1), "x", now)
    await store_shape.complete("default", [Lease(done_t.id, 1)], now)

    for t in (waiting, free, running_t, dead_t):
        cancelled = await store_shape.cancel(t.id, "default", now)
        assert cancelled.state is TaskState.CANCELLED and cancelled.finished_at == now
    (beat,) = await store_shape.heartbeat("default", [Lease(running_t.id, 1)], now)
    assert not beat.ok and beat.cancelled and beat.reason is LeaseMiss.CANCELLED
    (ack,) = await store_shape.complete("default", [Lease(running_t.id, 1)], now)
    assert not ack.ok and ack.reason is LeaseMiss.CANCELLED
    assert (await store_shape.list_tasks("default", state=TaskState.DEAD)).tasks == []
    with pytest.raises(InvalidTransition):
        await store_shape.cancel(done_t.id, "default", now)
    # A cancelled task never fires.
    owned = await owner(store_shape)
    assert (await store_shape.fire_due(owned, now + timedelta(hours=2))).fired == 0


async def test_an_expired_lease_is_reaped_to_a_backoff_or_dead(
    store_shape: TaskStore, now: datetime
) -> None:
    retry = await ready(store_shape, now, 2, queue="retry", max_attempts=3)
    last = await ready(store_shape, now, 2, queue="last", max_attempts=1)
    await store_shape.claim("default", ["retry", "last"], "w", 4, now)
    owned = await owner(store_shape)
    # Before the lease ends nothing is reaped, a heartbeat keeps one alive past it.
    assert await store_shape.reap_expired(owned, now + LEASE - timedelta(seconds=1)) == []
    kept = retry[1]
    beat_at = now + timedelta(seconds=20)
    (beat,) = await store_shape.heartbeat("default", [Lease(kept.id, 1)], beat_at)
    assert beat.ok
    at = now + LEASE + timedelta(seconds=1)

    reaped = {t.id: t for t in await store_shape.reap_expired(owned, at)}

    assert set(reaped) == {retry[0].id, last[0].id, last[1].id}
    back = reaped[retry[0].id]
    assert back.state is TaskState.SCHEDULED and back.run_at > at and back.attempt == 1
    assert "lease expired" in (back.last_error or "")
    assert {reaped[t.id].state for t in last} == {TaskState.DEAD}
    assert (await store_shape.get(kept.id, "default")).state is TaskState.RUNNING
    # The reaped attempt's worker can no longer finish it.
    (ack,) = await store_shape.complete("default", [Lease(back.id, 1)], at)
    assert not ack.ok and ack.reason is LeaseMiss.NOT_RUNNING
    assert await store_shape.reap_expired(owned, at) == []  # once only
