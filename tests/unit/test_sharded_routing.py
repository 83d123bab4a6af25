"""The store of shards' routing with fake shards (pure): a call refused because its
partition moved is routed again once under the refreshed map, bounded in time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from chronoq.errors import PartitionMoved
from chronoq.routing import new_task_ids
from chronoq.shardmap import ShardMap
from chronoq.store import shard_routing
from chronoq.store.sharded import ShardedStore

NOW = datetime(2030, 1, 1, tzinfo=UTC)
P = 4


def moved(partitions: tuple[int, ...]) -> Exception:
    """The store's refusal of a partition it no longer holds."""
    return PartitionMoved(partitions, 2)


class FakeShard:
    """Answers ``cancel`` with its name, or refuses as a shard that no longer holds it."""

    def __init__(self, name: str, moved: bool = False) -> None:
        self.name = name
        self.moved = moved
        self.calls = 0
        self.bucket_seconds = 60

    async def cancel(self, task_id: str, namespace: str, now: datetime) -> Any:
        self.calls += 1
        if self.moved:
            raise moved((0,))
        return self.name


def split(version: int, holder_of_0: str) -> ShardMap:
    return ShardMap(version, ("shard-0", "shard-1"), (holder_of_0, "shard-1", "shard-0", "shard-1"))


@pytest.fixture
def task_id() -> str:
    return str(new_task_ids([0], 1)[0])  # partition 0


async def test_a_moved_partition_is_routed_again_once_after_a_refresh(task_id: str) -> None:
    maps = [split(1, "shard-0")]
    old, new = FakeShard("shard-0", moved=True), FakeShard("shard-1")

    async def refresh() -> None:
        maps.append(split(2, "shard-1"))

    store = ShardedStore({"shard-0": old, "shard-1": new}, lambda: maps[-1], refresh=refresh)  # type: ignore[dict-item]
    assert await store.cancel(task_id, "default", NOW) == "shard-1"
    assert (old.calls, new.calls) == (1, 1)


async def test_refused_again_the_error_goes_to_the_caller(task_id: str) -> None:
    still = FakeShard("shard-0", moved=True)
    refreshed = 0

    async def refresh() -> None:
        nonlocal refreshed
        refreshed += 1

    m = split(1, "shard-0")
    store = ShardedStore(
        {"shard-0": still, "shard-1": FakeShard("shard-1")}, lambda: m, refresh=refresh
    )  # type: ignore[dict-item]
    with pytest.raises(PartitionMoved):
        await store.cancel(task_id, "default", NOW)
    assert (still.calls, refreshed) == (2, 1)


async def test_one_shard_holding_everything_is_retried_once_too(task_id: str) -> None:
    """The passthrough to the one store retries once as well, not once more on the way."""
    only = FakeShard("shard-0", moved=True)
    refreshed = 0

    async def refresh() -> None:
        nonlocal refreshed
        refreshed += 1

    m = ShardMap(1, ("shard-0",), ("shard-0",) * P)
    store = ShardedStore({"shard-0": only}, lambda: m, refresh=refresh)  # type: ignore[dict-item]
    with pytest.raises(PartitionMoved):
        await store.cancel(task_id, "default", NOW)
    assert (only.calls, refreshed) == (2, 1)


async def test_a_refresh_that_hangs_is_bounded(
    task_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_routing, "REFRESH_S", 0.05)

    async def hangs() -> None:
        await asyncio.sleep(60)

    m = split(1, "shard-0")
    store = ShardedStore(
        {"shard-0": FakeShard("shard-0", moved=True), "shard-1": FakeShard("shard-1")},
        lambda: m,
        refresh=hangs,
    )  # type: ignore[dict-item]
    with pytest.raises(PartitionMoved):
        await asyncio.wait_for(store.cancel(task_id, "default", NOW), 5)


def test_a_partly_accepted_batch_is_an_outage_the_sdk_repeats() -> None:
    from chronoq.client.client import STORE_OUTAGE_MARK
    from chronoq.errors import BatchPartlyAccepted

    err = BatchPartlyAccepted(tuple((i, f"id{i}", True) for i in range(9)), 20, ("shard-1",))
    assert err.grpc_code == "UNAVAILABLE" and STORE_OUTAGE_MARK in err.message
    assert "9 of 20 tasks accepted (id0, id1, id2, id3, ...)" in err.message
    assert "shard-1" in err.message and len(err.message) < 400
