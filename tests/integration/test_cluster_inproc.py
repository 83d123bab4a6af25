"""Several nodes in one process sharing partitions through a real etcd (fast feedback)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from chronoq.client import Client, NewTask
from chronoq.coordinator.etcd import ClusterSettings, EtcdSettings
from chronoq.coordinator.ownership import EtcdOwnership
from chronoq.models import TaskState
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(60)


def cluster(etcd: Any, name: str, ttl: int = 2) -> ClusterSettings:
    return ClusterSettings(
        etcd=EtcdSettings(endpoints=etcd.endpoints, cluster=name),
        lease_ttl=ttl,
        reconcile_interval=0.5,
        load_interval=0.5,
    )


async def settled(nodes: list[Node], partitions: int = 16, timeout: float = 10) -> dict[int, str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        owners: dict[int, str] = {}
        clash = False
        for n in nodes:
            assert n.ownership is not None
            for p in n.ownership.owned():
                clash |= p in owners
                owners[p] = n.settings.node_id
        assert not clash, "two nodes own one partition"
        if len(owners) == partitions:
            own = nodes[0].ownership
            assert isinstance(own, EtcdOwnership)
            if owners == own.assignment():
                return owners
        assert loop.time() < deadline, f"not settled: {Counter(owners.values())}"
        await asyncio.sleep(0.05)


async def test_nodes_split_partitions_and_hand_off(
    make_node: NodeFactory, etcd: Any, cluster_name: str, store: Store
) -> None:
    settings = cluster(etcd, cluster_name)
    nodes = [await make_node(cluster=settings, node_id=f"n{i}") for i in range(3)]
    owners = await settled(nodes)
    counts = Counter(owners.values())
    assert set(counts) == {"n0", "n1", "n2"} and max(counts.values()) <= 7
    fences = {f.partition: f for f in await store.fences()}
    own = nodes[0].ownership
    assert isinstance(own, EtcdOwnership)
    for p, (node, token) in own.owner_of().items():
        assert fences[p].token == token and fences[p].owner == node

    client = Client(nodes[1].address)
    subs = await client.submit_many(
        [NewTask(queue="c", delay=timedelta(milliseconds=300)) for _ in range(200)]
    )
    await asyncio.sleep(1.0)
    assert await store.count_by_state() == {TaskState.READY: 200}
    fired = sum(n.firer.stats.fired for n in nodes if n.firer is not None)
    assert fired == 200
    await client.close()
    assert subs

    # Graceful stop hands off at once; a fourth node joining takes about a quarter.
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await nodes[2].stop()
    owners = await settled(nodes[:2])
    assert loop.time() - t0 < 1.5
    assert set(owners.values()) == {"n0", "n1"}
    n3 = await make_node(cluster=settings, node_id="n3")
    owners = await settled([*nodes[:2], n3])
    assert 2 <= Counter(owners.values())["n3"] <= 7
