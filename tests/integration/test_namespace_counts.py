"""A namespace's schedule cap and quota hold across two store shards on two real databases,
with creates racing on both shards from two nodes (each its own store of shards): the counter
on shard-0 lets exactly the cap through, deletes and pauses free their share, a create refused
on its shard gives its place back, and a recount repairs the over-count a create of unknown
outcome leaves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from chronoq.errors import (
    AlreadyExists,
    NamespaceCapReached,
    PartitionMoved,
    ScheduleQuotaExceeded,
    ShardUnavailable,
)
from chronoq.models import ScheduleSpec
from chronoq.recurrence import Every
from chronoq.routing import key_partition
from chronoq.shardmap import ShardMap
from chronoq.store.counts import STALE
from chronoq.store.schedules import Schedules
from chronoq.store.sharded import ShardedSchedules, ShardedStore
from tests.contract.conftest import PARTITIONS, TWO_SHARDS, connect_shard, open_two

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
NS = "tenant"
TEN_S = timedelta(seconds=10)  # one task per 10 s: 0.1 tasks/s reserved


def spec(name: str) -> ScheduleSpec:
    return ScheduleSpec(name=name, queue="q", rule=Every(TEN_S, NOW), namespace=NS)


def names_on(shard: str, n: int, prefix: str = "s") -> list[str]:
    """``n`` schedule names whose (namespace, name) partition lives on ``shard``."""
    out: list[str] = []
    for i in range(10_000):
        name = f"{prefix}{i}"
        if TWO_SHARDS.shard_of(key_partition(NS, name, PARTITIONS)) == shard:
            out.append(name)
            if len(out) == n:
                return out
    raise AssertionError("no such names")


def spread(n: int, prefix: str = "s") -> list[str]:
    """``n`` names alternating between the two shards."""
    zero, one = names_on("shard-0", n, prefix), names_on("shard-1", n, prefix)
    return [x for pair in zip(zero, one, strict=True) for x in pair][:n]


@pytest.fixture
async def nodes(
    two_dsns: tuple[str, str],
) -> AsyncIterator[tuple[ShardedSchedules, ShardedSchedules]]:
    """Two nodes' schedules over the same two shards (each node its own pools)."""
    async with open_two(two_dsns) as a, open_two(two_dsns) as b:
        yield ShardedSchedules(a), ShardedSchedules(b)


async def outcomes(calls: list[asyncio.Future[object] | object]) -> list[object]:
    return await asyncio.gather(*calls, return_exceptions=True)  # type: ignore[arg-type]


async def test_racing_creates_on_both_shards_and_nodes_allow_exactly_the_cap(
    nodes: tuple[ShardedSchedules, ShardedSchedules],
) -> None:
    a, b = nodes
    cap = 5
    names = spread(16)
    await a.create(spec("warm"), NOW, cap=cap)  # the counter exists: the race is on it
    got = await outcomes(
        [(a if i % 2 else b).create(spec(n), NOW, cap=cap) for i, n in enumerate(names)]
    )
    made = [r for r in got if not isinstance(r, BaseException)]
    refused = [r for r in got if isinstance(r, NamespaceCapReached)]
    assert len(made) == cap - 1 and len(refused) == len(names) - (cap - 1), got
    assert (await a.count_all(NS))[0] == cap


async def test_racing_creates_from_no_counter_seed_it_once(
    nodes: tuple[ShardedSchedules, ShardedSchedules],
) -> None:
    a, b = nodes
    got = await outcomes(
        [(a if i % 2 else b).create(spec(n), NOW, cap=3) for i, n in enumerate(spread(10))]
    )
    assert sum(1 for r in got if not isinstance(r, BaseException)) == 3, got
    assert (await a.count_all(NS))[0] == 3


async def test_racing_creates_pass_no_quota(
    nodes: tuple[ShardedSchedules, ShardedSchedules],
) -> None:
    a, b = nodes
    quota = 0.4  # four schedules of 0.1 tasks/s
    await a.create(spec("warm"), NOW, quota=quota)
    got = await outcomes(
        [(a if i % 2 else b).create(spec(n), NOW, quota=quota) for i, n in enumerate(spread(12))]
    )
    assert sum(1 for r in got if not isinstance(r, BaseException)) == 3, got
    assert all(isinstance(r, ScheduleQuotaExceeded) for r in got if isinstance(r, BaseException))
    assert (await a.count_all(NS))[1] == pytest.approx(0.4)


async def test_deletes_free_their_places(
    nodes: tuple[ShardedSchedules, ShardedSchedules],
) -> None:
    a, b = nodes
    names = spread(4)
    for name in names:
        await a.create(spec(name), NOW, cap=4)
    more = spread(8, prefix="m")
    with pytest.raises(NamespaceCapReached):
        await b.create(spec(more[0]), NOW, cap=4)
    await b.delete(NS, names[0], NOW)  # one on each shard
    await a.delete(NS, names[1], NOW)
    await b.create(spec(more[0]), NOW, cap=4)
    await a.create(spec(more[1]), NOW, cap=4)
    with pytest.raises(NamespaceCapReached):
        await b.create(spec(more[2]), NOW, cap=4)


async def test_pause_frees_its_rate_once_and_resume_takes_it_again(
    nodes: tuple[ShardedSchedules, ShardedSchedules],
) -> None:
    a, b = nodes
    x, y, z = spread(3)
    await a.create(spec(x), NOW, quota=0.2)
    await b.create(spec(y), NOW, quota=0.2)
    with pytest.raises(ScheduleQuotaExceeded):
        await a.create(spec(z), NOW, quota=0.2)
    # Two pauses racing on two nodes release the rate once, not twice.
    await asyncio.gather(a.pause(NS, x, NOW), b.pause(NS, x, NOW))
    await a.create(spec(z), NOW, quota=0.2)
    with pytest.raises(ScheduleQuotaExceeded):
        await b.resume(NS, x, NOW, quota=0.2)
    assert (await a.get(NS, x)).paused
    await a.delete(NS, z, NOW)
    assert not (await b.resume(NS, x, NOW, quota=0.2)).paused


async def test_a_create_refused_on_its_shard_gives_its_place_back(
    nodes: tuple[ShardedSchedules, ShardedSchedules], two_dsns: tuple[str, str]
) -> None:
    a, _b = nodes
    first, second, third = spread(3)
    await a.create(spec(first), NOW, cap=2)
    with pytest.raises(AlreadyExists):
        await a.create(spec(first), NOW, cap=2)
    # A node routing by a map that sends the name to the shard that does not hold it: the
    # shard refuses it as moved (twice: there is no newer map), and the place goes back.
    swapped = ShardMap(1, TWO_SHARDS.shards, tuple(reversed(TWO_SHARDS.placement)))
    stores = {
        name: await connect_shard(dsn, TWO_SHARDS.held_by(name))
        for name, dsn in zip(TWO_SHARDS.shards, two_dsns, strict=True)
    }
    try:
        wrong = ShardedStore(stores, lambda: swapped)
        wrong.set_map(swapped)
        with pytest.raises(PartitionMoved):
            await ShardedSchedules(wrong).create(spec(second), NOW, cap=2)
    finally:
        for store in stores.values():
            await store.close()
    await a.create(spec(third), NOW, cap=2)  # both refusals gave their place back
    with pytest.raises(NamespaceCapReached):
        await a.create(spec(second), NOW, cap=2)


async def test_a_recount_repairs_what_an_unknown_outcome_over_counted(
    two_dsns: tuple[str, str],
) -> None:
    async with open_two(two_dsns) as a_store, open_two(two_dsns) as b_store:
        a, b = ShardedSchedules(a_store), ShardedSchedules(b_store)
        here, there = names_on("shard-0", 1)[0], names_on("shard-1", 2)
        await a.create(spec(here), NOW, cap=2)
        await b_store.stores["shard-1"].close()  # node b loses shard-1 mid-create
        with pytest.raises(ShardUnavailable):
            await b.create(spec(there[0]), NOW, cap=2)
        # Outcome unknown to b: its place stays taken (refuses more, never allows more).
        with pytest.raises(NamespaceCapReached):
            await a.create(spec(there[1]), NOW, cap=2)
        assert not await a.recount(NS, NOW)  # the take may still be in flight: left alone
        later = NOW + STALE + timedelta(seconds=1)
        assert await a.recount_due(later) == 1  # the namespace with a take left behind
        await a.create(spec(there[1]), later, cap=2)
        with pytest.raises(NamespaceCapReached):
            await a.create(spec("x"), later, cap=2)


async def test_a_seed_counts_the_schedules_made_before_the_counter(
    nodes: tuple[ShardedSchedules, ShardedSchedules], two_dsns: tuple[str, str]
) -> None:
    a, _b = nodes
    old = spread(4, prefix="old")
    for name in old:  # made while the map named one shard: no counter was kept
        shard = a.store.stores[TWO_SHARDS.shard_of(key_partition(NS, name, PARTITIONS))]
        await Schedules(shard).create(spec(name), NOW)
    new = spread(2, prefix="new")
    await a.create(spec(new[0]), NOW, cap=5)
    with pytest.raises(NamespaceCapReached):
        await a.create(spec(new[1]), NOW, cap=5)


async def test_one_shard_keeps_no_counter(dsn: str) -> None:
    one = ShardMap(1, ("shard-0",), ("shard-0",) * PARTITIONS)
    store = await connect_shard(dsn, range(PARTITIONS))
    try:
        sharded = ShardedStore({"shard-0": store}, lambda: one)
        schedules = ShardedSchedules(sharded)
        await schedules.create(spec("a"), NOW, cap=1)
        with pytest.raises(NamespaceCapReached):
            await schedules.create(spec("b"), NOW, cap=1)
        assert await schedules.recount_due(NOW) == 0
        async with store.connection() as conn:
            assert await conn.fetchval("SELECT count(*) FROM namespace_counts") == 0
    finally:
        with contextlib.suppress(Exception):
            await store.close()
