"""Kept queue counts across nodes and store shards (real PostgreSQL servers, real etcd): each
owner counts its own partitions, a QueueCounts sums every shard's, and the per-queue gauges
have one series per queue in the cluster (the leading node's), so a sum over nodes is right."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chronoq.client import Client, NewTask
from chronoq.node import Node
from chronoq.queuecounts import StateCounts
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled
from tests.integration.test_node_shards import keys_on, second  # noqa: F401 (a fixture)
from tests.integration.test_queue_counts import by_queue, counted_after

pytestmark = pytest.mark.timeout(120)

FAST = {"queue_counts_interval": timedelta(milliseconds=100)}


def gauge(node: Node, name: str) -> dict[tuple[str, str], float]:
    """The node's samples of gauge ``name`` by (namespace, queue)."""
    text = generate_latest(node.metrics.registry).decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels["namespace"], s.labels["queue"]] = s.value
    return out


async def test_the_queue_gauges_have_one_series_per_queue_in_a_cluster(
    make_node: NodeFactory, etcd: Any, cluster_name: str
) -> None:
    nodes = [
        await make_node(cluster=cluster(etcd, cluster_name), node_id=f"n{i}", **FAST)
        for i in range(2)
    ]
    await settled(nodes)
    client = Client(nodes[0].address, timeout=10)
    try:
        await client.submit_many([NewTask(queue="mail") for _ in range(3)])
        snap = await counted_after(client, datetime.now(UTC))
        assert by_queue(snap)["mail"] == StateCounts(ready=3)
        key = ("default", "mail")
        for _ in range(200):
            ready = [gauge(n, "chronoq_queue_ready").get(key) for n in nodes]
            if sum(r or 0 for r in ready) == 3:
                break
            await asyncio.sleep(0.05)
        assert sorted(r is not None for r in ready) == [False, True], ready  # the leader's
        assert sum(r or 0 for r in ready) == 3
        ages = [gauge(n, "chronoq_queue_oldest_ready_seconds").get(key) for n in nodes]
        assert [a is not None for a in ages] == [r is not None for r in ready]
        assert all(a >= 0 for a in ages if a is not None)
    finally:
        await client.close()


async def test_counts_over_two_shards_are_each_shards_partitions_summed(
    make_node: NodeFactory,
    etcd: Any,
    cluster_name: str,
    dsn: str,
    second: str,  # noqa: F811 (the fixture)
) -> None:
    node = await make_node(
        cluster=cluster(etcd, cluster_name), node_id="n0", store_shards=(second,), **FAST
    )
    await settled([node])
    client = Client(node.address, timeout=10)
    try:
        later = datetime.now(UTC) + timedelta(hours=1)
        for key in keys_on("shard-0", 4, "a"):
            await client.submit("q", idempotency_key=key, run_at=later)
        for key in keys_on("shard-1", 6, "b"):
            await client.submit("q", idempotency_key=key, run_at=later)
        snap = await counted_after(client, datetime.now(UTC))
        assert by_queue(snap) == {"q": StateCounts(scheduled=10)}
        assert snap.uncounted_partitions == 0
        for shard_dsn, partitions, n in ((dsn, range(8), 4), (second, range(8, 16), 6)):
            conn = await asyncpg.connect(shard_dsn, timeout=5)
            try:
                rows = await conn.fetch("SELECT partition, n FROM queue_state_counts")
                marks = await conn.fetch("SELECT partition FROM queue_counts_at")
            finally:
                await conn.close()
            assert sum(r["n"] for r in rows) == n  # each shard counts its own tasks
            assert {r["partition"] for r in marks} == set(partitions)
    finally:
        await client.close()
