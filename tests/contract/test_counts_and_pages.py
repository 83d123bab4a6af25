"""Contract: counts (per bucket, per queue and state, per state) and keyset pages that miss
and repeat nothing while tasks are added."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pytest

from chronoq.buckets import bucket_of
from chronoq.errors import InvalidArgument
from chronoq.models import Lease, Task, TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)

ALL = list(range(PARTITIONS))


async def submit(store: TaskStore, now: datetime, specs: list[TaskSpec]) -> list[Task]:
    return [o.task for o in await store.submit(specs, now)]


async def test_pending_counts_per_partition_and_bucket(
    store_shape: TaskStore, now: datetime
) -> None:
    tasks = await submit(
        store_shape,
        now,
        [TaskSpec(queue="c", run_at=now + timedelta(seconds=20 * i + 60)) for i in range(60)],
    )
    first, last = bucket_of(now), bucket_of(now + timedelta(hours=1))
    expected = Counter((t.partition, t.bucket) for t in tasks)
    assert await store_shape.pending_by_bucket(ALL, first, last) == dict(expected)
    some = [0, 1, 2]
    narrow = (bucket_of(now) + 3, bucket_of(now) + 5)
    assert await store_shape.pending_by_bucket(some, *narrow) == {
        k: n for k, n in expected.items() if k[0] in some and narrow[0] <= k[1] <= narrow[1]
    }
    # Fired tasks are no longer pending.
    owned = {}
    for p in ALL:
        assert await store_shape.take_fence(p, 1, "contract", "me") is not None
        owned[p] = 1
    at = now + timedelta(minutes=5)
    await store_shape.fire_due(owned, at)
    left = Counter((t.partition, t.bucket) for t in tasks if t.run_at > at)
    assert await store_shape.pending_by_bucket(ALL, first, last) == dict(left)


async def test_pending_counts_for_the_loads_leave_out_the_overdue_tasks(
    store_shape: TaskStore, now: datetime
) -> None:
    # Submitted 50 s ago, due from 45 s ago on: some are overdue (waiting to fire), in this
    # bucket and the one before, the others are still coming.
    earlier = now - timedelta(seconds=50)
    tasks = await submit(
        store_shape,
        earlier,
        [TaskSpec(queue="c", run_at=earlier + timedelta(seconds=5 * i)) for i in range(1, 61)],
    )
    # The loads' window (chronoq.coordinator.loads.coming): five buckets from the current
    # one, and of those only the tasks due after now.
    first = bucket_of(now, store_shape.bucket_seconds)
    last = first + 4
    every = Counter((t.partition, t.bucket) for t in tasks if first <= t.bucket <= last)
    ahead = Counter(
        (t.partition, t.bucket) for t in tasks if first <= t.bucket <= last and t.run_at > now
    )
    counted = await store_shape.pending_by_bucket(ALL, first, last, due_after=now)
    assert counted == dict(ahead)
    # Without a bound (the status page's count) the overdue ones of those buckets count too.
    assert sum(ahead.values()) < sum(every.values())
    assert await store_shape.pending_by_bucket(ALL, first, last) == dict(every)


async def test_queue_counts_by_state_with_their_bounds(
    store_shape: TaskStore, now: datetime
) -> None:
    soon = now + timedelta(minutes=1)
    await submit(
        store_shape,
        now,
        [TaskSpec(queue="a", run_at=now) for _ in range(5)]
        + [TaskSpec(queue="b", run_at=soon) for _ in range(3)]
        + [TaskSpec(queue="c", run_at=now, max_attempts=1) for _ in range(2)]
        + [TaskSpec(queue="a", run_at=now, namespace="other")],
    )
    (running,) = await store_shape.claim("default", ["a"], "w", 1, now)
    dead = await store_shape.claim("default", ["c"], "w", 1, now)
    await store_shape.fail("default", Lease(dead[0].id, 1), "x", now)
    states = [TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING, TaskState.DEAD]

    counts = await store_shape.queue_counts("default", states, max_tasks=1000, max_queues=100)

    got = {(c.queue, c.state): c.count for c in counts.counts}
    assert got == {
        ("a", TaskState.READY): 4,
        ("a", TaskState.RUNNING): 1,
        ("b", TaskState.SCHEDULED): 3,
        ("c", TaskState.READY): 1,
        ("c", TaskState.DEAD): 1,
    }
    oldest = {(c.queue, c.state): c.oldest_run_at for c in counts.counts}
    assert oldest[("b", TaskState.SCHEDULED)] == soon
    assert not counts.capped and not counts.truncated
    # Bounded: counting stops at max_tasks per state, answers max_queues queues per state.
    small = await store_shape.queue_counts("default", [TaskState.READY], max_tasks=2, max_queues=1)
    assert TaskState.READY in small.capped  # its count is a lower bound, and says so
    assert len(small.counts) == 1
    with pytest.raises(InvalidArgument):
        await store_shape.queue_counts("default", [TaskState.SUCCEEDED], max_tasks=9, max_queues=9)
    assert await store_shape.count_by_state() == {
        TaskState.READY: 6,
        TaskState.SCHEDULED: 3,
        TaskState.RUNNING: 1,
        TaskState.DEAD: 1,
    }
    assert running.queue == "a"


async def test_ready_counts_and_depths(store_shape: TaskStore, now: datetime) -> None:
    await submit(
        store_shape,
        now,
        [TaskSpec(queue="a", run_at=now) for _ in range(5)]
        + [TaskSpec(queue="b", run_at=now + timedelta(seconds=30)) for _ in range(2)],
    )
    await store_shape.claim("default", ["a"], "w", 2, now)
    counts = await store_shape.ready_counts([("default", "a"), ("default", "b")], [10, 10])
    assert counts.get(("default", "a")) == 3 and counts.get(("default", "b"), 0) == 0
    assert await store_shape.ready_counts([("default", "a")], [1]) == {("default", "a"): 1}
    depth = await store_shape.queue_depth(ALL, bucket_of(now), bucket_of(now) + 2)
    assert depth == {
        ("default", "a", "READY"): 3,
        ("default", "a", "RUNNING"): 2,
        ("default", "b", "SCHEDULED"): 2,
    }


async def test_pages_miss_and_repeat_nothing_while_tasks_are_added(
    store_shape: TaskStore, now: datetime
) -> None:
    before = await submit(store_shape, now, [TaskSpec(queue="p", run_at=now) for _ in range(230)])
    seen: list[str] = []
    token = ""
    added: list[Task] = []
    for _ in range(100):  # bounded: far more than the pages there are
        page = await store_shape.list_tasks("default", page_size=37, page_token=token)
        seen += [t.id for t in page.tasks]
        added += await submit(store_shape, now, [TaskSpec(queue="p", run_at=now)] * 5)
        if not (token := page.next_token):
            break
    assert token == "", "the listing never ended"
    assert len(seen) == len(set(seen)), "a task came twice"
    assert {t.id for t in before} <= set(seen), "a task was missed"
    assert set(seen) <= {t.id for t in before + added}


async def test_filtered_and_byte_bounded_pages(store_shape: TaskStore, now: datetime) -> None:
    big = b"x" * 2000
    tasks = await submit(
        store_shape,
        now,
        [TaskSpec(queue="p" if i % 2 else "q", run_at=now, payload=big) for i in range(40)],
    )
    claimed = {t.id for t in await store_shape.claim("default", ["p"], "w", 7, now)}

    async def walk(queue: str | None = None, state: TaskState | None = None) -> list[str]:
        ids: list[str] = []
        token = ""
        for _ in range(100):
            page = await store_shape.list_tasks(
                "default",
                queue=queue,
                state=state,
                page_size=100,
                page_token=token,
                max_bytes=9000,
            )
            assert 1 <= len(page.tasks) <= 5  # ended early by its bytes, never empty
            ids += [t.id for t in page.tasks]
            if not (token := page.next_token):
                return ids
        raise AssertionError("the listing never ended")

    assert sorted(await walk()) == sorted(t.id for t in tasks)
    assert sorted(await walk(queue="q")) == sorted(t.id for t in tasks if t.queue == "q")
    assert sorted(await walk(state=TaskState.RUNNING)) == sorted(claimed)
    with pytest.raises(InvalidArgument):
        await store_shape.list_tasks("default", page_token="not a token")
    with pytest.raises(InvalidArgument):
        await store_shape.list_tasks("default", page_size=0)


async def test_retention_purges_finished_tasks_of_its_partitions(
    store_shape: TaskStore, now: datetime
) -> None:
    await submit(store_shape, now, [TaskSpec(queue="r", run_at=now) for _ in range(30)])
    done = await store_shape.claim("default", ["r"], "w", 20, now)
    await store_shape.complete("default", [Lease(t.id, 1) for t in done], now)
    some = sorted({t.partition for t in done})[:2]
    in_some = [t for t in done if t.partition in some]
    later = now + timedelta(days=1)
    assert (
        await store_shape.purge_finished(some, [TaskState.SUCCEEDED], now, 100) == 0
    )  # not before
    purged = 0
    for _ in range(len(in_some) + 1):  # bounded batches of 1
        n = await store_shape.purge_finished(some, [TaskState.SUCCEEDED], later, 1)
        assert n in (0, 1)
        if not n:
            break
        purged += n
    assert purged == len(in_some)
    counts = await store_shape.count_by_state()
    assert counts[TaskState.SUCCEEDED] == len(done) - len(in_some)
    assert counts[TaskState.READY] == 10
