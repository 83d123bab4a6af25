"""Contract: a queue limited per concurrency key never runs more than its limit of one key's
tasks at once, starts a key's tasks in (priority, run_at) order, never lets a full key hold
back the other keys' work, and paces each key's starts by its rate."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime, timedelta

import pytest

from chronoq.models import Lease, Task, TaskSpec
from chronoq.store.port import TaskStore

pytestmark = pytest.mark.timeout(60)

NS = "default"
KEYED = frozenset({(NS, "k")})


def spec(key: str | None, run_at: datetime, *, priority: int = 0, queue: str = "k") -> TaskSpec:
    return TaskSpec(queue=queue, run_at=run_at, concurrency_key=key, priority=priority)


async def claim(store: TaskStore, now: datetime, n: int = 50, worker: str = "w") -> list[Task]:
    return await store.claim(NS, ["k"], worker, n, now, keyed=KEYED)


async def test_one_task_of_a_key_runs_at_a_time_in_run_at_order(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.set_queue(NS, "k", now, max_running_per_key=1, cap=10)
    specs = [spec(key, now - timedelta(seconds=i)) for key in "abc" for i in range(5)]
    specs += [spec(None, now) for _ in range(4)]  # keyless: not limited
    await store_shape.submit(specs, now)
    first = await claim(store_shape, now)
    assert Counter(t.concurrency_key for t in first) == {"a": 1, "b": 1, "c": 1, None: 4}
    assert await claim(store_shape, now) == []  # every key full
    # Each key runs its tasks one after another, earliest run_at first.
    order: dict[str, list[datetime]] = {}
    running = {t.concurrency_key: t for t in first if t.concurrency_key}
    while running:
        for task in running.values():
            assert task.concurrency_key is not None
            order.setdefault(task.concurrency_key, []).append(task.run_at)
        acks = await store_shape.complete(
            NS, [Lease(t.id, t.attempt) for t in running.values()], now
        )
        assert all(a.ok for a in acks)
        got = await claim(store_shape, now)
        assert len({t.concurrency_key for t in got}) == len(got)  # one per key
        running = {t.concurrency_key: t for t in got}
    for key in "abc":
        assert order[key] == sorted(order[key]) and len(order[key]) == 5


async def test_a_higher_priority_task_of_a_key_starts_first(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.set_queue(NS, "k", now, max_running_per_key=1, cap=10)
    await store_shape.submit([spec("a", now - timedelta(seconds=9))], now)
    await store_shape.submit([spec("a", now, priority=5)], now)
    (task,) = await claim(store_shape, now)
    assert task.priority == 5


async def test_a_full_key_never_holds_back_the_other_keys(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.set_queue(NS, "k", now, max_running_per_key=1, cap=10)
    # One key with a long backlog at the front of the queue, then 40 keys of one task each.
    await store_shape.submit([spec("hot", now - timedelta(hours=1)) for _ in range(600)], now)
    await store_shape.submit([spec(f"k{i:02}", now) for i in range(40)], now)
    hot = await claim(store_shape, now, n=1)
    assert [t.concurrency_key for t in hot] == ["hot"]
    got: list[Task] = []
    for _ in range(10):  # bounded; every claim takes other keys' work while "hot" is full
        batch = await claim(store_shape, now, n=8)
        assert batch, "a claim found nothing while other keys had ready work"
        assert "hot" not in {t.concurrency_key for t in batch}
        got += batch
        if len(got) >= 40:
            break
    assert sorted(t.concurrency_key or "" for t in got) == [f"k{i:02}" for i in range(40)]


async def test_concurrent_claims_never_pass_a_keys_limit(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.set_queue(NS, "k", now, max_running_per_key=2, cap=10)
    await store_shape.submit([spec(f"k{i % 5}", now) for i in range(60)], now)
    batches = await asyncio.gather(*(claim(store_shape, now, 6, f"w{i}") for i in range(8)))
    per_key = Counter(t.concurrency_key for b in batches for t in b)
    assert all(n <= 2 for n in per_key.values()), per_key
    # A key another claim held locked is skipped, not waited for: what the concurrent claims
    # left free, the next claims take, and then no key has room.
    for _ in range(5):
        per_key.update(t.concurrency_key for t in await claim(store_shape, now, 6, "late"))
    assert per_key == {f"k{i}": 2 for i in range(5)}
    assert await claim(store_shape, now, 6, "last") == []


async def test_a_slot_is_freed_by_fail_release_and_cancel(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.set_queue(NS, "k", now, max_running_per_key=1, cap=10)
    await store_shape.submit([spec("a", now - timedelta(seconds=i)) for i in range(4)], now)
    (t1,) = await claim(store_shape, now)
    await store_shape.release(NS, Lease(t1.id, t1.attempt))
    (t2,) = await claim(store_shape, now)
    assert t2.id == t1.id  # released: still the key's head
    await store_shape.fail(NS, Lease(t2.id, t2.attempt), "boom", now, retry_after=timedelta(0))
    (t3,) = await claim(store_shape, now)
    assert await claim(store_shape, now) == []
    await store_shape.cancel(t3.id, NS, now)
    assert len(await claim(store_shape, now)) == 1


async def test_a_claim_that_does_not_know_the_queue_is_keyed_takes_nothing_of_it(
    store_shape: TaskStore, now: datetime
) -> None:
    """A node whose gate has not read the new limit yet cannot start past it."""
    await store_shape.set_queue(NS, "k", now, max_running_per_key=1, cap=10)
    await store_shape.submit([spec("a", now) for _ in range(3)], now)
    assert await store_shape.claim(NS, ["k"], "w", 10, now) == []
    assert len(await claim(store_shape, now)) == 1


async def test_starts_of_a_key_are_paced_by_its_rate(store_shape: TaskStore, now: datetime) -> None:
    await store_shape.set_queue(NS, "k", now, max_starts_per_key=2.0, cap=10)  # 2 a second
    await store_shape.submit([spec(key, now) for key in "ab" for _ in range(20)], now)
    started: Counter[str | None] = Counter()
    at = now
    for _ in range(40):  # 4 s in steps of 0.1 s
        got = await claim(store_shape, at)
        started.update(t.concurrency_key for t in got)
        await store_shape.complete(NS, [Lease(t.id, t.attempt) for t in got], at)
        at += timedelta(milliseconds=100)
    # A bucket of one token, refilled at 2 a second: the first start at once, then one each
    # 0.5 s; 3.9 s of refill allows 1 + 7 starts per key, never more.
    assert started == {"a": 8, "b": 8}


async def test_limits_apply_to_one_queue_only(store_shape: TaskStore, now: datetime) -> None:
    await store_shape.set_queue(NS, "k", now, max_running_per_key=1, cap=10)
    await store_shape.submit([spec("a", now, queue="free") for _ in range(3)], now)
    got = await store_shape.claim(NS, ["free", "k"], "w", 10, now, keyed=KEYED)
    assert len(got) == 3
