"""Rows from before routing once partitions move, on two real databases: a keyed task made
before routing (a v7 or v4 id, in the partition of its id's hash) is still the one answer to
its key after its key's partition (or its own) moved to another shard, and no second task is
made anywhere; a schedule from before routing is found by its name after its home moved; the
routes of purged tasks go. The old rows are written with raw SQL, as the old code wrote them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from chronoq.buckets import bucket_of, partition_of
from chronoq.ids import time_ordered_ids
from chronoq.models import ScheduleSpec, TaskSpec, TaskState
from chronoq.node.shard_admin import make_mover
from chronoq.recurrence import Cron
from chronoq.routing import key_partition
from chronoq.shardmap import ShardMap
from chronoq.store import Store
from chronoq.store.legacy import RoutesFirst, build
from chronoq.store.mover import PartitionMove
from chronoq.store.schedules import Schedules
from chronoq.store.sharded import ShardedSchedules, ShardedStore
from tests.integration.test_mover import HOLDINGS, _open

pytestmark = pytest.mark.timeout(120)

P = 8
NS = "default"
NOW = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)


@pytest.fixture
async def shards(dsn: str, target_dsn: str) -> AsyncIterator[tuple[Store, Store]]:
    """shard-0 holding every partition (as a deployment from before shards), shard-1 none."""
    source = await _open(dsn, None)
    target = await _open(target_dsn, ())
    try:
        yield source, target
    finally:
        await source.close()
        await target.close()


def old_id(version: int) -> uuid.UUID:
    """An id as chronoq minted before routing: v7 (time-ordered) or, before that, v4."""
    if version == 7:
        (made,) = time_ordered_ids(1, int(NOW.timestamp() * 1000) - 60_000)
        return made
    return uuid.uuid4()


def key_elsewhere(row_partition: int, prefix: str = "old") -> str:
    """An idempotency key whose partition (by key) is not the row's (by id hash)."""
    return next(
        k
        for k in (f"{prefix}-{i}" for i in range(1000))
        if key_partition(NS, k, P) != row_partition
    )


async def old_task(
    store: Store, task_id: uuid.UUID, key: str, state: TaskState = TaskState.SCHEDULED
) -> int:
    """A keyed task as chronoq wrote it before routing: placed by the hash of its id."""
    partition = partition_of(task_id.bytes, P)
    run_at = NOW + timedelta(minutes=5)
    finished = NOW - timedelta(days=30) if state is TaskState.SUCCEEDED else None
    async with store.connection() as conn:
        await conn.execute(
            """
            INSERT INTO tasks (id, namespace, queue, partition, bucket, run_at, state,
                               idempotency_key, max_attempts, backoff_initial_ms, backoff_max_ms,
                               lease_timeout_ms, misfire_grace_ms, created_at, finished_at)
            VALUES ($1, $7, 'legacy', $2, $3, $4::timestamptz, $5, $6, 3, 1000, 60000, 30000,
                    60000, $4::timestamptz - interval '1 minute', $8)
            """,
            task_id,
            partition,
            bucket_of(run_at, store.bucket_seconds),
            run_at,
            int(state),
            key,
            NS,
            finished,
        )
    return partition


async def old_schedule(store: Store, home: int) -> tuple[str, uuid.UUID, int]:
    """A schedule as chronoq wrote it before routing (a v4 id, placed by its hash), named so
    that its home by (namespace, name) is ``home``: (name, id, the partition it is in)."""
    while True:
        schedule_id = uuid.uuid4()
        if partition_of(schedule_id.bytes, P) != home:
            break
    name = next(n for n in (f"s{i}" for i in range(1000)) if key_partition(NS, n, P) == home)
    await Schedules(store).create(ScheduleSpec(name=name, queue="q", rule=Cron("*/5 * * * *")), NOW)
    partition = partition_of(schedule_id.bytes, P)
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE schedules SET id = $1, partition = $2 WHERE namespace = $3 AND name = $4",
            schedule_id,
            partition,
            NS,
            name,
        )
    return name, schedule_id, partition


async def move(source: Store, target: Store, partition: int, *, routes: bool = True) -> ShardMap:
    """Move one partition from shard-0 to shard-1 through every phase, the way the move
    driver's mover does (``RoutesFirst``: the routes built first); the map after it."""
    kind = RoutesFirst if routes else PartitionMove
    mover = kind(source, target, (partition,), "m-legacy-1", 7, holdings=HOLDINGS)
    await mover.prepare()
    await mover.copy()
    await mover.catch_up()
    await mover.cut_over(2)
    await mover.clean_up()
    placement = tuple("shard-1" if p == partition else "shard-0" for p in range(P))
    return ShardMap(2, ("shard-0", "shard-1"), placement)


def routed(source: Store, target: Store, shard_map: ShardMap) -> ShardedStore:
    sharded = ShardedStore({"shard-0": source, "shard-1": target}, lambda: shard_map)
    sharded.set_map(shard_map)
    return sharded


async def keyed_everywhere(stores: tuple[Store, ...], key: str) -> list[uuid.UUID]:
    found: list[uuid.UUID] = []
    for store in stores:
        async with store.connection() as conn:
            found += [
                r["id"]
                for r in await conn.fetch(
                    "SELECT id FROM tasks WHERE namespace = $1 AND idempotency_key = $2", NS, key
                )
            ]
    return found


def resubmit(key: str) -> list[TaskSpec]:
    return [TaskSpec(queue="legacy", run_at=NOW, idempotency_key=key)]


@pytest.mark.parametrize("version", [7, 4])
@pytest.mark.parametrize("moved", ["key", "row"])
async def test_a_resubmit_after_a_move_answers_the_task_from_before_routing(
    shards: tuple[Store, Store], version: int, moved: str
) -> None:
    source, target = shards
    task_id = old_id(version)
    row = partition_of(task_id.bytes, P)
    key = key_elsewhere(row)
    await old_task(source, task_id, key)
    # Another old task whose key lands in its own row's partition needs no route.
    near_id = old_id(version)
    near_key = next(
        k
        for k in (f"near-{i}" for i in range(1000))
        if key_partition(NS, k, P) == partition_of(near_id.bytes, P)
    )
    await old_task(source, near_id, near_key)

    # The key's partition goes to shard-1 while the task stays; or the task's row goes while
    # the key stays: either way the key and its task are on two shards now.
    shard_map = await move(source, target, key_partition(NS, key, P) if moved == "key" else row)
    sharded = routed(source, target, shard_map)
    assert shard_map.shard_of(key_partition(NS, key, P)) != shard_map.shard_of(row)

    (again,) = await sharded.submit(resubmit(key), NOW)
    assert not again.created and again.task.id == str(task_id)
    assert again.task.partition == row
    assert list(await sharded.submit_ids(resubmit(key) * 2, NOW)) == [(str(task_id), False)] * 2
    assert await keyed_everywhere((source, target), key) == [task_id]  # no second task
    # The task near its key's partition is answered as ever.
    (near,) = await sharded.submit(resubmit(near_key), NOW)
    assert not near.created and near.task.id == str(near_id)


async def test_without_the_routes_the_same_resubmit_makes_a_second_task(
    shards: tuple[Store, Store],
) -> None:
    """The attack the routes close: the move made without building them first."""
    source, target = shards
    task_id = old_id(7)
    key = key_elsewhere(partition_of(task_id.bytes, P))
    await old_task(source, task_id, key)
    sharded = routed(
        source, target, await move(source, target, key_partition(NS, key, P), routes=False)
    )
    (again,) = await sharded.submit(resubmit(key), NOW)
    assert again.created and again.task.id != str(task_id)
    assert len(await keyed_everywhere((source, target), key)) == 2


async def test_a_schedule_from_before_routing_is_found_by_name_after_its_home_moved(
    shards: tuple[Store, Store],
) -> None:
    source, target = shards
    home = 5
    name, schedule_id, was = await old_schedule(source, home)
    built = await build(source)
    assert built.rehomed == 1
    async with source.connection() as conn:
        assert (
            await conn.fetchval("SELECT partition FROM schedules WHERE id = $1", schedule_id)
            == home
        )
    sharded = routed(source, target, await move(source, target, home))
    found = await ShardedSchedules(sharded).get(NS, name)
    assert found.id == str(schedule_id) and found.partition == home
    async with target.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM schedules WHERE id = $1", schedule_id) == 1
    assert was != home


async def test_the_build_runs_once_and_only_on_the_shard_that_holds_every_partition(
    shards: tuple[Store, Store],
) -> None:
    source, target = shards
    ids = [old_id(7) for _ in range(30)] + [old_id(4) for _ in range(30)]
    for i, task_id in enumerate(ids):
        await old_task(source, task_id, key_elsewhere(partition_of(task_id.bytes, P), f"k{i}"))
    # New tasks (v8 ids, placed by key) need no route.
    await source.submit(
        [TaskSpec(queue="q", run_at=NOW, idempotency_key=f"new-{i}") for i in range(50)], NOW
    )
    first = await build(source, page=7)  # many pages
    assert (first.routes, first.read) == (60, 60)
    async with source.connection() as conn:
        routes = {r["id"]: r for r in await conn.fetch("SELECT * FROM legacy_routes")}
    assert set(routes) == set(ids)
    for task_id, r in routes.items():
        assert r["row_partition"] == partition_of(task_id.bytes, P)
        assert r["partition"] == key_partition(NS, r["key"], P) != r["row_partition"]
    again = await build(source)
    assert again.skipped == "built already" and again.routes == 60
    assert (await build(target)).skipped  # holds nothing: nothing to build there
    # The move driver's mover is the one that builds them first.
    assert isinstance(make_mover(1.0)(source, target, (1,), "m-legacy-2", 7), RoutesFirst)


async def test_routes_of_purged_tasks_go_and_their_key_makes_a_new_task(
    shards: tuple[Store, Store],
) -> None:
    source, target = shards
    done_id = old_id(7)
    done_key = key_elsewhere(partition_of(done_id.bytes, P), "done")
    moving = key_partition(NS, done_key, P)
    # Both keys in one partition, the one that moves, and neither row in it (a random v4 id
    # lands there one time in P: its key would need no route, and no key would be found).
    gone_id = next(
        i for i in (old_id(4) for _ in range(1000)) if partition_of(i.bytes, P) != moving
    )
    gone_key = next(
        k for k in (f"gone-{i}" for i in range(5000)) if key_partition(NS, k, P) == moving
    )
    await old_task(source, done_id, done_key, TaskState.SUCCEEDED)
    await old_task(source, gone_id, gone_key)
    sharded = routed(source, target, await move(source, target, moving))
    async with target.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM legacy_routes") == 2

    # Retention: the finished task is purged on its shard, its route on the key's shard.
    purged = await sharded.purge_finished(range(P), [TaskState.SUCCEEDED], NOW, 100)
    assert purged == 1
    await sharded.purge_finished(range(P), [TaskState.SUCCEEDED], NOW, 100)
    async with target.connection() as conn:
        left = [r["id"] for r in await conn.fetch("SELECT id FROM legacy_routes")]
    assert left == [gone_id]
    (fresh,) = await sharded.submit(resubmit(done_key), NOW)
    assert fresh.created and fresh.task.id != str(done_id)

    # A route whose task went before any sweep saw it: the submit finds the task gone,
    # drops the route and makes the task.
    async with source.connection() as conn:
        await conn.execute("DELETE FROM tasks WHERE id = $1", gone_id)
    (made,) = await sharded.submit(resubmit(gone_key), NOW)
    assert made.created and made.task.id != str(gone_id)
    async with target.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM legacy_routes") == 0
    assert len(await keyed_everywhere((source, target), gone_key)) == 1


async def test_a_route_whose_task_moved_into_the_history_stays_and_answers(
    shards: tuple[Store, Store],
) -> None:
    """The history's sweep moves an old finished task on its row's shard: its route stays
    (the task is still there), and a resubmit of its key answers it, not a new task."""
    source, target = shards
    done_id = old_id(7)
    done_key = key_elsewhere(partition_of(done_id.bytes, P), "kept")
    moving = key_partition(NS, done_key, P)
    await old_task(source, done_id, done_key, TaskState.SUCCEEDED)
    sharded = routed(source, target, await move(source, target, moving))
    keep, width = timedelta(days=60), timedelta(days=2)
    await sharded.keep_history(NOW, retention=keep, width=width)
    done = await sharded.retire_finished(range(P), NOW, NOW, retention=keep, width=width, batch=100)
    assert (done.gone, done.kept) == (1, 1)
    await sharded.retire_finished(range(P), NOW, NOW, retention=keep, width=width, batch=100)
    async with target.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM legacy_routes") == 1
    (again,) = await sharded.submit(resubmit(done_key), NOW)
    assert not again.created and again.task.id == str(done_id)
