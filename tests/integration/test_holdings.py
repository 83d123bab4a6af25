"""A shard's holdings of the map on a real server: the freeze waits for the writes in flight
and refuses the ones that start while it waits, a stale mover is refused, and the first
connects of a shard adopt its partitions once, however many race."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from chronoq.errors import PartitionMoved
from chronoq.models import Lease, TaskSpec
from chronoq.store import Store, holdings
from chronoq.store.connection import PARTITION_MOVED_SQLSTATE
from chronoq.store.holdings import FROZEN, GONE, INCOMING, LIVE, FreezeTimedOut
from chronoq.store.mover import MoveRefused, StaleMoveToken
from chronoq.store.sql import q

pytestmark = pytest.mark.timeout(60)

P = 8
NOW = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
#: Seconds any wait of these tests may take at most (a bound, not a timing goal).
BOUND = 20.0


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[Store]:
    s = await Store.connect(dsn, partitions=P, min_size=1, max_size=4)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def raw(dsn: str) -> AsyncIterator[list[asyncpg.Connection]]:
    """Two connections of their own, for writes held open mid-transaction: the first on the
    writes' last lock stripe, the second on the first one, so that a freeze holds the
    second's stripe already while it waits for the first's (a write on a stripe the freeze
    has not reached yet simply commits before the freeze does)."""
    conns = [await asyncpg.connect(dsn) for _ in range(3 * holdings.LOCK_STRIPES)]
    stripe = {c: c.get_server_pid() % holdings.LOCK_STRIPES for c in conns}
    last = next(c for c in conns if stripe[c] == holdings.LOCK_STRIPES - 1)
    first = next(c for c in conns if stripe[c] == 0)
    try:
        yield [last, first]
    finally:
        for c in conns:
            await c.close()


def insert_args(store: Store, partition: int) -> tuple[Any, list[Any]]:
    spec = TaskSpec(queue="w", run_at=NOW, lease_timeout=timedelta(seconds=30))
    ids, cols = store._insert_columns([spec], NOW, [partition])
    return ids[0], [*cols, NOW]


async def waiting_on_the_writes_lock(store: Store, n: int) -> None:
    """Until ``n`` sessions wait for the writes' advisory lock (bounded)."""
    deadline = asyncio.get_running_loop().time() + BOUND
    while True:
        async with store.connection() as conn:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid = $1::bigint::oid",
                holdings.LOCK_CLASS,
            )
        if waiting >= n:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{waiting} waiting, not {n}"
        await asyncio.sleep(0.02)


async def test_freeze_waits_for_the_write_in_flight_and_refuses_one_begun_while_it_waits(
    store: Store, raw: list[asyncpg.Connection]
) -> None:
    a, b = raw
    in_flight, a_args = insert_args(store, 2)
    late, b_args = insert_args(store, 2)
    transaction = a.transaction()
    await transaction.start()
    await a.fetch(q("insert_task_ids"), *a_args)  # written, not committed

    freezing = asyncio.create_task(holdings.freeze(store, [2], "m1", 7, wait_s=BOUND))
    await waiting_on_the_writes_lock(store, 1)
    assert not freezing.done()  # it waits for the write in flight
    # A write that starts now queues behind the freeze...
    starting = asyncio.create_task(b.fetch(q("insert_task_ids"), *b_args))
    await waiting_on_the_writes_lock(store, 2)

    await transaction.commit()
    frozen = await asyncio.wait_for(freezing, BOUND)
    assert [h.state for h in frozen] == [FROZEN]
    # ...and, once it runs, reads the frozen state: refused, nothing written.
    with pytest.raises(asyncpg.PostgresError) as refused:
        await asyncio.wait_for(starting, BOUND)
    assert refused.value.sqlstate == PARTITION_MOVED_SQLSTATE
    assert (await store.get(str(in_flight), "default")).id == str(in_flight)
    async with store.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM tasks WHERE id = $1", late) == 0


async def test_a_write_of_another_partition_is_not_refused_by_the_freeze(
    store: Store, raw: list[asyncpg.Connection]
) -> None:
    a, _ = raw
    _, a_args = insert_args(store, 5)
    transaction = a.transaction()
    await transaction.start()
    await a.fetch(q("insert_task_ids"), *a_args)
    freezing = asyncio.create_task(holdings.freeze(store, [2], "m1", 7, wait_s=BOUND))
    await waiting_on_the_writes_lock(store, 1)
    await transaction.commit()  # the freeze waited for it, and it committed
    await asyncio.wait_for(freezing, BOUND)
    spec = TaskSpec(queue="w", run_at=NOW)
    assert len(await store.submit([spec], NOW, partitions=[5])) == 1
    with pytest.raises(PartitionMoved):
        await store.submit([spec], NOW, partitions=[2])


async def test_a_freeze_gives_up_when_a_write_in_flight_outlasts_its_wait(
    store: Store, raw: list[asyncpg.Connection]
) -> None:
    a, _ = raw
    _, a_args = insert_args(store, 2)
    transaction = a.transaction()
    await transaction.start()
    await a.fetch(q("insert_task_ids"), *a_args)
    with pytest.raises(FreezeTimedOut, match="were not frozen"):
        await holdings.freeze(store, [2], "m1", 7, wait_s=0.3)
    assert (await holdings.held(store))[2].state == LIVE
    await transaction.commit()
    spec = TaskSpec(queue="w", run_at=NOW)
    assert len(await store.submit([spec], NOW, partitions=[2])) == 1  # nothing was frozen


async def test_a_stale_mover_is_refused_and_a_newer_one_takes_over(store: Store) -> None:
    await holdings.freeze(store, [1, 2], "m1", 5)
    # The newer driver (a higher token) takes the frozen partitions over...
    await holdings.freeze(store, [1, 2], "m2", 9)
    # ...and the older one is refused, whatever it tries next.
    for step in (holdings.unfreeze, holdings.mark_gone, holdings.freeze, holdings.mark_incoming):
        with pytest.raises(StaleMoveToken, match="token 5 is stale"):
            await step(store, [1], "m1", 5)
    held = await holdings.held(store)
    assert (held[1].state, held[1].move_id, held[1].move_token) == (FROZEN, "m2", 9)
    # A step the state does not allow is refused, and changes nothing.
    with pytest.raises(MoveRefused, match="cannot make live partition 1"):
        await holdings.make_live(store, [1, 2], 2, "m2", 9)
    with pytest.raises(MoveRefused, match="cannot mark incoming partition 3"):
        await holdings.mark_incoming(store, [3], "m2", 9)  # live here, not this move's
    # Replays are idempotent.
    await holdings.unfreeze(store, [1, 2], "m2", 9)
    await holdings.unfreeze(store, [1, 2], "m2", 9)
    assert {p: h.state for p, h in (await holdings.held(store)).items() if p in (1, 2)} == {
        1: LIVE,
        2: LIVE,
    }


async def test_a_target_goes_incoming_live_and_back_for_one_move(dsn: str) -> None:
    target = await Store.connect(dsn, partitions=P, min_size=1, max_size=2, holds=())
    try:
        assert await holdings.held(target) == {}
        await holdings.mark_incoming(target, [4, 5], "m1", 7)
        await holdings.make_live(target, [4, 5], 3, "m1", 7)
        await holdings.make_live(target, [4, 5], 3, "m1", 7)  # a replay
        with pytest.raises(MoveRefused):
            await holdings.make_live(target, [4, 5], 4, "m1", 7)  # not another version
        target.map_version = 3
        spec = TaskSpec(queue="w", run_at=NOW, lease_timeout=timedelta(seconds=30))
        await target.submit([spec], NOW, partitions=[4])
        (task,) = await target.claim("default", ["w"], "w", 5, NOW)
        # A rollback: the target back to incoming (every write refused), then gone.
        await holdings.mark_incoming(target, [4, 5], "m1", 7)
        with pytest.raises(PartitionMoved):
            await target.complete("default", [Lease(task.id, task.attempt)], NOW)
        await holdings.mark_gone(target, [4, 5], "m1", 7)
        assert {h.state for h in (await holdings.held(target)).values()} == {GONE}
        await holdings.mark_incoming(target, [4], "m3", 11)  # a later move in again
        assert (await holdings.held(target))[4].state == INCOMING
    finally:
        await target.close()


async def test_concurrent_first_connects_adopt_one_holding_once(dsn: str) -> None:
    asks: list[tuple[int, ...] | None] = [(0, 1, 2, 3), (4, 5, 6, 7), None, (0, 1, 2, 3)] * 2
    stores = await asyncio.gather(
        *(Store.connect(dsn, partitions=P, min_size=1, max_size=1, holds=h) for h in asks)
    )
    try:
        held = await holdings.held(stores[0])
        live = tuple(sorted(p for p, h in held.items() if h.state == LIVE))
        assert live in {(0, 1, 2, 3), (4, 5, 6, 7), tuple(range(P))}
        assert all(h.since_version == 1 and h.move_id is None for h in held.values())
        # Any later connect leaves a held table as it is.
        again = await Store.connect(dsn, partitions=P, min_size=1, max_size=1)
        await again.close()
        assert await holdings.held(stores[0]) == held
    finally:
        for s in stores:
            await s.close()


async def test_a_store_from_before_the_upgrade_adopts_every_partition_with_its_tasks(
    dsn: str,
) -> None:
    old = await Store.connect(dsn, partitions=P, min_size=1, max_size=2)
    spec = TaskSpec(queue="w", run_at=NOW, lease_timeout=timedelta(seconds=30))
    try:
        await old.submit([spec] * 20, NOW)
        (task,) = await old.claim("default", ["w"], "w", 1, NOW)
        async with old.connection() as conn:  # the schema as it was before migration 0011
            await conn.execute(
                "DROP FUNCTION chronoq_live, chronoq_hold_ids, chronoq_hold;"
                " DROP TABLE shard_partitions;"
                " DELETE FROM schema_migrations WHERE version = 11"
            )
    finally:
        await old.close()
    upgraded = await Store.connect(dsn, partitions=P, min_size=1, max_size=2)
    try:
        held = await holdings.held(upgraded)
        assert sorted(held) == list(range(P)) and {h.state for h in held.values()} == {LIVE}
        assert (await upgraded.complete("default", [Lease(task.id, task.attempt)], NOW))[0].ok
        assert len(await upgraded.claim("default", ["w"], "w", 50, NOW)) == 19
    finally:
        await upgraded.close()
