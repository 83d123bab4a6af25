"""A cut-over's freeze holds its own partitions only: a node's owner statement over a shard
that refuses some frozen partitions is asked again at once for the shard's other partitions
(whose due tasks fire), while the frozen ones stay unwritten, whether the map splits the
partitions over two shards or one shard holds them all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from chronoq.models import TaskSpec, TaskState
from chronoq.shardmap import ShardMap
from chronoq.store import holdings
from chronoq.store.sharded import ShardedStore
from chronoq.store.store import Store
from tests.contract.conftest import PARTITIONS, TWO_SHARDS, connect_shard

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
DUE = NOW + timedelta(minutes=1)
LATER = NOW + timedelta(minutes=3)
ALL_ON_0 = ShardMap(1, ("shard-0", "shard-1"), ("shard-0",) * PARTITIONS)


@pytest.mark.parametrize("shard_map", [TWO_SHARDS, ALL_ON_0], ids=["split", "all-on-shard-0"])
async def test_a_frozen_partition_does_not_hold_back_its_shards_other_partitions(
    two_dsns: tuple[str, str], shard_map: ShardMap
) -> None:
    stores: dict[str, Store] = {}
    try:
        for name, dsn in zip(shard_map.shards, two_dsns, strict=True):
            stores[name] = await connect_shard(dsn, shard_map.held_by(name))
        sharded = ShardedStore(stores, lambda: shard_map)
        sharded.set_map(shard_map)
        out = await sharded.submit([TaskSpec(queue="q", run_at=DUE) for _ in range(80)], NOW)
        on_0 = shard_map.held_by("shard-0")
        frozen, spared = on_0[0], on_0[1]
        by_partition = {p: [o.task.id for o in out if o.task.partition == p] for p in on_0}
        assert by_partition[frozen] and by_partition[spared]
        fences = await sharded.take_fences_local(range(PARTITIONS), "node-a")
        owned = {p: f.token for p, f in fences.items()}

        await holdings.freeze(stores["shard-0"], [frozen], "m1", 7)
        fired = await sharded.fire_due(owned, LATER)

        assert fired.per_partition[frozen] == 0
        assert fired.fired == len(out) - len(by_partition[frozen])
        for task_id in by_partition[spared]:
            assert (await sharded.get(task_id, "default")).state is TaskState.READY
        for task_id in by_partition[frozen]:  # refused: nothing of it was written
            assert (await sharded.get(task_id, "default")).state is TaskState.SCHEDULED
    finally:
        for store in stores.values():
            await store.close()
