"""A node whose clock is wrong stops firing: it hands its partitions to a healthy node, says
NOT_SERVING, and rejoins once its clock agrees with the store's again (real etcd, real
PostgreSQL, the skew injected through the node's Clock)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronoq.client import Client, NewTask
from chronoq.clock import OffsetClock
from chronoq.coordinator.etcd import ClusterSettings
from chronoq.models import TaskState
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(90)


def cluster(etcd: Any, name: str) -> ClusterSettings:
    return ClusterSettings(
        etcd=etcd.client_settings(name),
        lease_ttl=2,
        reconcile_interval=0.5,
        load_interval=0.5,
    )


async def until(what: str, condition: Any, timeout: float = 20) -> None:
    for _ in range(round(timeout / 0.05)):  # bounded
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def owned(node: Node) -> int:
    assert node.ownership is not None
    return len(node.ownership.owned())


async def test_a_node_with_a_wrong_clock_hands_off_and_comes_back(
    make_node: NodeFactory, etcd: Any, cluster_name: str, store: Store
) -> None:
    settings = cluster(etcd, cluster_name)
    healthy = await make_node(cluster=settings, node_id="healthy")
    ahead = OffsetClock(timedelta(seconds=3))
    skewed = await make_node(cluster=settings, node_id="skewed", clock=ahead)
    assert skewed.clock_check is not None and healthy.clock_check is not None
    assert skewed.clock_check.skewed  # measured before it took any partition
    await until("the healthy node owns every partition", lambda: owned(healthy) == 16)
    assert skewed.health is not None and not skewed.health.healthy()
    problems = skewed.health.problems()
    assert any(p.startswith("clock off by +") for p in problems), problems
    last = skewed.clock_check.last
    assert last is not None and abs(last.offset + timedelta(seconds=3)) < timedelta(seconds=0.1)
    assert healthy.health is not None and healthy.health.healthy()

    # Tasks due over the next second, submitted to the skewed node (its API answers by the
    # corrected clock): all fired by the healthy node, none early.
    async with Client(skewed.address) as client:
        subs = await client.submit_many(
            [
                NewTask(queue="q", run_at=datetime.now(UTC) + timedelta(milliseconds=300 + 10 * i))
                for i in range(100)
            ]
        )
        await until(
            "every task fired",
            lambda: healthy.firer is not None and healthy.firer.stats.fired >= 100,
        )
        for sub in subs:
            task = await client.get(sub.task.id)
            assert task.state is TaskState.READY
            assert task.fired_at is not None and task.fired_at >= task.run_at
    assert skewed.firer is not None and skewed.firer.stats.fired == 0
    assert all(f.owner != "skewed" for f in await store.fences())  # it never took one

    # Its clock is put right: it rejoins and fires its share again.
    ahead.offset = timedelta(0)
    await until("the skewed node rejoins", lambda: owned(skewed) > 0)
    await until("it serves again", lambda: skewed.health is not None and skewed.health.healthy())
    assert not skewed.clock_check.skewed and skewed.clock_check.suspensions == 1
    await until(
        "the two share the partitions",
        lambda: owned(healthy) + owned(skewed) == 16 and owned(healthy) < 16,
    )


async def test_a_clock_within_the_bound_keeps_firing(
    make_node: NodeFactory, etcd: Any, cluster_name: str
) -> None:
    settings = cluster(etcd, cluster_name)
    nodes = [
        await make_node(
            cluster=settings, node_id="a", clock=OffsetClock(timedelta(milliseconds=-200))
        ),
        await make_node(cluster=settings, node_id="b"),
    ]
    await until("both own a share", lambda: all(owned(n) > 0 for n in nodes))
    for n in nodes:
        assert n.clock_check is not None
        await n.clock_check.check()
        assert not n.clock_check.skewed and n.clock_check.last is not None
        assert n.clock_check.last.uncertainty < timedelta(milliseconds=100)
    a = nodes[0].clock_check
    assert a is not None and a.last is not None
    assert abs(a.last.offset - timedelta(milliseconds=200)) < timedelta(milliseconds=100)
