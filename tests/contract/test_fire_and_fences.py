"""Contract: an owner fires the due tasks of its own partitions, never early, and only while
its fencing token is the partition's current one."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

import pytest

from chronoq.buckets import bucket_of
from chronoq.models import Task, TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)

CLUSTER = "contract"


async def spread(store: TaskStore, now: datetime, n: int, step: timedelta) -> list[Task]:
    """``n`` tasks due one ``step`` apart from ``now + step`` on (partitions as the store
    places them)."""
    specs = [TaskSpec(queue="f", run_at=now + step * (i + 1)) for i in range(n)]
    return [o.task for o in await store.submit(specs, now)]


async def own(
    store: TaskStore, partitions: range | list[int], token: int, owner: str
) -> dict[int, int]:
    """Take ``partitions`` with ``token`` (as an etcd create revision would be); partition →
    token of the ones taken."""
    owned = {}
    for p in partitions:
        fence = await store.take_fence(p, token, CLUSTER, owner)
        assert fence is not None and fence.token == token
        owned[p] = token
    return owned


async def states(store: TaskStore, tasks: list[Task]) -> dict[str, TaskState]:
    return {t.id: (await store.get(t.id, t.namespace)).state for t in tasks}


async def test_an_owner_fires_its_partitions_due_tasks_only_and_never_early(
    store_shape: TaskStore, now: datetime
) -> None:
    tasks = await spread(store_shape, now, 80, timedelta(seconds=1))
    mine = range(PARTITIONS // 2)
    owned = await own(store_shape, mine, 7, "me")
    at = now + timedelta(seconds=40)  # tasks 0..39 are due, exactly up to ``at``

    result = await store_shape.fire_due(owned, at, node_id="me")

    due_mine = [t for t in tasks if t.partition in mine and t.run_at <= at]
    others = [t for t in tasks if t.partition not in mine and t.run_at <= at]
    assert due_mine and others  # 80 tasks over 8 partitions: both sides hold due tasks
    assert result.fired == len(due_mine) and result.skipped == 0
    assert sum(result.ready_by_queue.values()) == len(due_mine)
    now_states = await states(store_shape, tasks)
    for t in tasks:
        fired = t.partition in mine and t.run_at <= at
        assert now_states[t.id] is (TaskState.READY if fired else TaskState.SCHEDULED), t
    one = await store_shape.get(due_mine[0].id, "default")
    assert (one.fired_by, one.fire_token, one.fired_at) == ("me", 7, at)
    # Again at the same instant: nothing more is due.
    assert (await store_shape.fire_due(owned, at)).fired == 0
    # A microsecond later, still nothing: the next task is due a whole second later.
    assert (await store_shape.fire_due(owned, at + timedelta(microseconds=1))).fired == 0


async def test_backfill_fires_every_missed_bucket(store_shape: TaskStore, now: datetime) -> None:
    """An owner taking partitions late fires what came due while no one owned them."""
    tasks = await spread(store_shape, now, 40, timedelta(minutes=1))  # 40 buckets
    owned = await own(store_shape, range(PARTITIONS), 1, "late")
    fired = 0
    at = now + timedelta(hours=1)
    for _ in range(100):  # bounded: a pass fires up to its batch per partition
        result = await store_shape.fire_due(owned, at, batch=3)
        fired += result.fired
        if not result.saturated():
            break
    assert fired == 40
    assert set((await states(store_shape, tasks)).values()) == {TaskState.READY}


async def test_a_stale_fence_writes_nothing(store_shape: TaskStore, now: datetime) -> None:
    tasks = await spread(store_shape, now, 40, timedelta(seconds=1))
    parts = range(PARTITIONS)
    old = await own(store_shape, parts, 10, "old")
    new = await own(store_shape, parts, 11, "new")  # a newer owner: "old" is fenced
    at = now + timedelta(minutes=5)
    ids = [t.id for t in tasks]

    assert (await store_shape.fire_due(old, at)).fired == 0
    assert (await store_shape.fire_listed(old, at, ids)).fired == 0
    assert await store_shape.advance_watermarks(old, bucket_of(at) + 5) == set()
    assert await store_shape.reap_expired(old, at + timedelta(days=1)) == []
    assert set((await states(store_shape, tasks)).values()) == {TaskState.SCHEDULED}
    # The old token cannot come back either; the current owner's claim is idempotent.
    for p in parts:
        assert await store_shape.take_fence(p, 10, CLUSTER, "old") is None
        again = await store_shape.take_fence(p, 11, CLUSTER, "new")
        assert again is not None and again.token == 11
    assert {f.partition: (f.token, f.owner) for f in await store_shape.fences()} == {
        p: (11, "new") for p in parts
    }

    assert (await store_shape.fire_due(new, at)).fired == 40


async def test_a_stale_owner_cannot_reap_what_the_new_owner_holds(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.submit(
        [TaskSpec(queue="r", run_at=now, lease_timeout=timedelta(seconds=5)) for _ in range(8)],
        now,
    )
    claimed = await store_shape.claim("default", ["r"], "w", 8, now)
    parts = range(PARTITIONS)
    old = await own(store_shape, parts, 3, "old")
    new = await own(store_shape, parts, 4, "new")
    later = now + timedelta(seconds=6)
    assert await store_shape.reap_expired(old, later) == []
    for t in claimed:
        assert (await store_shape.get(t.id, "default")).state is TaskState.RUNNING
    reaped = await store_shape.reap_expired(new, later)
    assert sorted(t.id for t in reaped) == sorted(t.id for t in claimed)


async def test_local_fences_bump_every_token(store_shape: TaskStore, now: datetime) -> None:
    """A single node takes every partition with a token above the stored one, fencing any
    earlier process on the same store."""
    parts = list(range(PARTITIONS))
    first = await store_shape.take_fences_local(parts, "one")
    second = await store_shape.take_fences_local(parts, "two")
    assert set(first) == set(second) == set(parts)
    assert all(second[p].token > first[p].token for p in parts)
    await spread(store_shape, now, 16, timedelta(seconds=1))
    at = now + timedelta(minutes=1)
    assert (await store_shape.fire_due({p: f.token for p, f in first.items()}, at)).fired == 0
    assert (await store_shape.fire_due({p: f.token for p, f in second.items()}, at)).fired == 16


async def test_watermarks_advance_for_the_owner_only(store_shape: TaskStore, now: datetime) -> None:
    owned = await own(store_shape, [0, 1], 5, "me")
    bucket = bucket_of(now) + 3
    assert await store_shape.advance_watermarks(owned, bucket) == {0, 1}
    marks = {f.partition: f.watermark for f in await store_shape.fences()}
    assert marks == {0: bucket, 1: bucket}


async def test_listed_tasks_fire_when_due_and_owned_only(
    store_shape: TaskStore, now: datetime
) -> None:
    tasks = await spread(store_shape, now, 48, timedelta(seconds=1))
    by_partition: dict[int, list[Task]] = defaultdict(list)
    for t in tasks:
        by_partition[t.partition].append(t)
    mine = [p for p in by_partition if p % 2 == 0]
    owned = await own(store_shape, mine, 2, "me")
    at = now + timedelta(seconds=24)
    result = await store_shape.fire_listed(owned, at, [t.id for t in tasks], node_id="me")
    expected = [t for t in tasks if t.partition in owned and t.run_at <= at]
    assert result.fired == len(expected) > 0
    got = await states(store_shape, tasks)
    assert {i for i, s in got.items() if s is TaskState.READY} == {t.id for t in expected}


async def test_due_soon_lists_what_an_owner_will_fire(
    store_shape: TaskStore, now: datetime
) -> None:
    tasks = await spread(store_shape, now, 30, timedelta(seconds=2))
    parts = [0, 1, 2]
    soon = await store_shape.due_soon(parts, now, now + timedelta(seconds=30), limit=100)
    expected = [
        t for t in tasks if t.partition in parts and t.run_at <= now + timedelta(seconds=30)
    ]
    assert sorted(i for i, *_ in soon) == sorted(t.id for t in expected)
    assert [at for _i, _p, at, _ns, _q in soon] == sorted(t.run_at for t in expected)
    # due_soon fires nothing.
    assert set((await states(store_shape, expected)).values()) == {TaskState.SCHEDULED}


async def test_a_new_coordinator_cluster_restarts_the_tokens(store_shape: TaskStore) -> None:
    """etcd revisions restart at 1 in a new etcd cluster: a token of another cluster id is
    taken whatever its number; within that cluster, tokens only grow again."""
    assert await store_shape.take_fence(0, 100, "etcd-a", "old") is not None
    fresh = await store_shape.take_fence(0, 2, "etcd-b", "new")
    assert fresh is not None and fresh.token == 2
    assert await store_shape.take_fence(0, 1, "etcd-b", "other") is None  # older, same cluster
    (fence,) = [f for f in await store_shape.fences() if f.partition == 0]
    assert (fence.token, fence.cluster_id, fence.owner) == (2, "etcd-b", "new")


async def test_a_flood_in_one_namespace_does_not_hold_back_another(
    store_shape: TaskStore, now: datetime
) -> None:
    """Each namespace due in a partition takes an equal share of the owner's batch."""
    due = now + timedelta(seconds=1)
    await store_shape.submit(
        [TaskSpec(queue="f", run_at=due, namespace="flood") for _ in range(400)], now
    )
    small = [
        o.task
        for o in await store_shape.submit(
            [TaskSpec(queue="f", run_at=due, namespace="small") for _ in range(5)], now
        )
    ]
    owned = await own(store_shape, range(PARTITIONS), 1, "me")
    result = await store_shape.fire_due(owned, due, batch=10)  # a share of 5 per namespace
    assert result.fired <= 10 * PARTITIONS
    assert result.unfinished  # the flood is not done, and says so
    assert set((await states(store_shape, small)).values()) == {TaskState.READY}
