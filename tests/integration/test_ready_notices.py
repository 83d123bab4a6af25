"""A task made ready on one node wakes the long-polls of the others at once (NOTIFY/LISTEN).

Nodes in one process on a real etcd and PostgreSQL. The re-check that would otherwise find the
task (``claim_poll``) is set far beyond the bounds asserted, so only a notice can explain them.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import timedelta
from typing import Any

import pytest

from chronoq.client import Client, NewTask
from chronoq.node import Node
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled

pytestmark = pytest.mark.timeout(120)


async def _nodes(make_node: NodeFactory, etcd: Any, name: str, **overrides: Any) -> list[Node]:
    settings = cluster(etcd, name)
    nodes = [await make_node(cluster=settings, node_id=f"n{i}", **overrides) for i in range(3)]
    await settled(nodes)
    return nodes


async def test_a_task_fired_on_one_node_wakes_a_long_poll_on_another(
    make_node: NodeFactory, etcd: Any, cluster_name: str
) -> None:
    nodes = await _nodes(make_node, etcd, cluster_name, claim_poll=timedelta(seconds=30))
    async with Client(nodes[0].address) as submitter:
        for i, waiter_node in enumerate(nodes):
            assert waiter_node.ownership is not None
            async with Client(waiter_node.address) as waiter:
                # A task another node owns (fires), on a queue of its own: only that node's
                # notice can wake this long-poll.
                for attempt in range(50):
                    queue = f"q{i}-{attempt}"
                    due = await submitter.submit(queue, delay=timedelta(milliseconds=300))
                    if due.task.partition not in waiter_node.ownership.owned():
                        break
                (claimed,) = await waiter.claim([queue], wait=timedelta(seconds=20))
                late = time.time() - due.task.run_at.timestamp()
                assert claimed.id == due.task.id
                assert late < 5.0, f"claimed {late:.1f} s after run_at on {waiter_node.address}"
    assert sum(n.broadcast.heard for n in nodes if n.broadcast is not None) > 0


@pytest.mark.slow
@pytest.mark.parametrize("notices", [False, True])
async def test_run_lateness_across_three_nodes(
    make_node: NodeFactory, etcd: Any, cluster_name: str, notices: bool
) -> None:
    """Run lateness (claim time - run_at) of tasks due over a few seconds, workers long-polling
    on every node; printed, not asserted (compare the two runs)."""
    nodes = await _nodes(
        make_node, etcd, cluster_name, claim_poll=timedelta(milliseconds=500), ready_notices=notices
    )
    clients = [Client(n.address) for n in nodes]
    lateness: list[float] = []
    total = 300
    try:
        await clients[0].submit_ids(
            [NewTask(queue="q", delay=timedelta(seconds=1 + i / 60)) for i in range(total)]
        )

        async def work(client: Client) -> None:
            while len(lateness) < total:
                for task in await client.claim(["q"], max_tasks=5, wait=timedelta(seconds=2)):
                    lateness.append(time.time() - task.run_at.timestamp())

        workers = [asyncio.create_task(work(c)) for c in clients for _ in range(3)]
        await asyncio.wait_for(asyncio.gather(*workers), 60)
    finally:
        for c in clients:
            await c.close()
    lateness.sort()
    p99 = lateness[int(len(lateness) * 0.99) - 1]
    print(
        f"\nnotices={notices}: run lateness p50 {statistics.median(lateness) * 1000:.0f} ms,"
        f" p99 {p99 * 1000:.0f} ms, max {lateness[-1] * 1000:.0f} ms over {len(lateness)} tasks"
    )
