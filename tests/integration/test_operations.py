"""Operating a node: Prometheus metrics, health, drain and retention (real servers)."""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.coordinator.etcd import ClusterSettings
from chronoq.embedded.etcd import EmbeddedEtcd
from chronoq.models import Lease, TaskState
from chronoq.store import Store
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(90)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2
        )
    return int(reply.status)


async def test_metrics_count_what_happens(make_node: NodeFactory, clock: ManualClock) -> None:
    node = await make_node(clock=clock, metrics_port=0)
    assert node.metrics_port
    client = Client(node.address)
    try:
        await client.submit_many(
            [NewTask(queue="m", delay=timedelta(seconds=30), max_attempts=1) for _ in range(5)]
        )
        clock.advance(timedelta(seconds=31))
        assert node.firer is not None
        await node.firer.tick()
        tasks = await client.claim(["m"], max_tasks=5)
        await client.complete_many([Lease(t.id, 1) for t in tasks[:3]])
        await client.fail(Lease(tasks[3].id, 1), "boom")
        assert node.depth is not None
        await node.depth.poll()  # as its loop does every 15 s
        m = scrape(node.metrics_port)
    finally:
        await client.close()
    assert m["chronoq_tasks_submitted_total"] == 5
    assert m["chronoq_tasks_fired_total"] == 5
    assert m["chronoq_tasks_completed_total"] == 3
    assert m["chronoq_tasks_failed_total"] == 1 and m["chronoq_tasks_dead_total"] == 1
    assert m["chronoq_fire_lateness_seconds_count"] == 5
    assert m["chronoq_fire_lateness_seconds_sum"] == 5.0  # each fired 1 s after its run_at
    assert m["chronoq_owned_partitions"] == 16
    assert m["chronoq_fire_rows_per_tick_sum"] >= 5
    assert 'chronoq_queue_depth{namespace="default",queue="m",state="RUNNING"}' in m


@pytest.fixture
def frozen_etcd(tmp_path: Path) -> Any:
    server = EmbeddedEtcd(tmp_path / "etcd", members=1)
    server.start()
    try:
        yield server
    finally:
        pid = server.members[0].pid
        if pid:
            os.kill(pid, signal.SIGCONT)
        server.stop()


async def test_health_is_not_serving_while_the_node_cannot_own(
    make_node: NodeFactory, frozen_etcd: EmbeddedEtcd
) -> None:
    settings = ClusterSettings(
        etcd=frozen_etcd.client_settings("h", timeout=1.0), lease_ttl=2
    )
    node = await make_node(cluster=settings, node_id="h0")
    for _ in range(100):
        if await health(node.address) == health_pb2.HealthCheckResponse.SERVING:
            break
        await asyncio.sleep(0.05)
    assert await health(node.address) == health_pb2.HealthCheckResponse.SERVING
    pid = frozen_etcd.members[0].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # etcd freezes: keepalives time out, the lease deadline passes
    try:
        await asyncio.sleep(3.5)
        assert node.ownership is not None and node.ownership.owned() == {}
        assert await health(node.address) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        os.kill(pid, signal.SIGCONT)
    for _ in range(200):  # a new lease, a new epoch, the partitions again
        if await health(node.address) == health_pb2.HealthCheckResponse.SERVING:
            break
        await asyncio.sleep(0.05)
    assert await health(node.address) == health_pb2.HealthCheckResponse.SERVING
    assert len(node.ownership.owned()) == 16


async def test_drain_hands_partitions_off_and_keeps_serving(
    make_node: NodeFactory, etcd: Any, cluster_name: str
) -> None:
    settings = ClusterSettings(
        etcd=etcd.client_settings(cluster_name),
        lease_ttl=2,
        reconcile_interval=0.3,
    )
    nodes = [await make_node(cluster=settings, node_id=f"d{i}") for i in range(2)]
    for _ in range(200):
        if all(n.ownership and n.ownership.owned() for n in nodes):
            break
        await asyncio.sleep(0.05)
    client = Client(nodes[0].address)
    try:
        released = await client.drain()
        assert released and nodes[0].ownership is not None
        assert nodes[0].ownership.owned() == {}
        for _ in range(200):
            if len(nodes[1].ownership.owned()) == 16:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)
        assert len(nodes[1].ownership.owned()) == 16  # type: ignore[union-attr]
        sub = await client.submit("after-drain")  # the drained node still serves the API
        assert sub.created
        await asyncio.sleep(1.0)
        assert nodes[0].ownership.owned() == {}  # and takes nothing back
        assert await health(nodes[0].address) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await client.close()


async def test_retention_purges_old_finished_tasks_only(
    make_node: NodeFactory, clock: ManualClock, store: Store
) -> None:
    node = await make_node(
        clock=clock,
        retention=timedelta(hours=1),
        dead_retention=timedelta(days=2),
        retention_batch=7,
    )
    client = Client(node.address)
    try:
        await client.submit_many([NewTask(queue="r", max_attempts=1) for _ in range(30)])
        await client.submit("r-later", delay=timedelta(days=5))
        running = await client.claim(["r"], max_tasks=30)
        await client.complete_many([Lease(t.id, 1) for t in running[:20]])
        for t in running[20:25]:
            await client.fail(Lease(t.id, 1), "x")  # DEAD
        clock.advance(timedelta(hours=2))
        recent = await client.submit("r")  # finished recently: kept
        (fresh,) = await client.claim(["r"])
        await client.complete(Lease(fresh.id, 1))
        assert node.retention is not None and node.reaper is not None
        await node.reaper.reap()  # (its loop would anyway) the 5 expired leases end DEAD
        purged = await node.retention.purge()
    finally:
        await client.close()
    assert purged == 20  # in batches of 7
    counts = await store.count_by_state()
    # 5 failed DEAD + 5 whose leases expired during the 2 h (reaped to DEAD, max_attempts=1):
    # all within the DLQ's 2-day retention. The far-future task is untouched.
    assert counts == {TaskState.SUCCEEDED: 1, TaskState.DEAD: 10, TaskState.SCHEDULED: 1}
    assert (await store.get(recent.task.id, "default")).state is TaskState.SUCCEEDED


async def test_queue_dispatch_limit_holds_across_nodes(make_node: NodeFactory) -> None:
    """Two nodes share one limit of 5 tasks/s (burst 5): claims through both together
    get 5 at once, then about 5 per second."""
    a = await make_node()
    b = await make_node()
    ca, cb = Client(a.address), Client(b.address)
    try:
        await ca.set_queue_limit("slow", rate=5, burst=5)
        assert await cb.queue_limits() == {"slow": (5.0, 5.0)}
        await ca.submit_many([NewTask(queue="slow") for _ in range(40)])
        await ca.submit_many([NewTask(queue="fast") for _ in range(40)])
        await asyncio.sleep(2.1)  # nodes re-read limits every 2 s
        first = await ca.claim(["slow"], max_tasks=40)
        second = await cb.claim(["slow"], max_tasks=40)
        assert len(first) + len(second) <= 6  # the burst (plus what 2 s of refill allows)
        got = len(first) + len(second)
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < 2.0:
            got += len(await ca.claim(["slow"], max_tasks=10))
            got += len(await cb.claim(["slow"], max_tasks=10))
            await asyncio.sleep(0.05)
        assert got <= 6 + 5 * 2.5  # never faster than the rate across both nodes
        assert got >= 10  # but it does dispatch
        assert len(await ca.claim(["fast"], max_tasks=40)) == 40  # other queues unaffected
        await ca.set_queue_limit("slow", rate=0)
        assert await ca.queue_limits() == {}
    finally:
        await ca.close()
        await cb.close()


async def test_submit_quota_refuses_with_resource_exhausted(make_node: NodeFactory) -> None:
    from chronoq import errors

    # A slow rate: on a loaded machine the 20-task submit and the next call can take over
    # 100 ms, which at 10/s would already refill a token and let the next submit through.
    node = await make_node(submit_quota=2.0, submit_quota_burst=20.0)
    client = Client(node.address)
    other = Client(node.address, namespace="other")
    try:
        await client.submit_many([NewTask(queue="q") for _ in range(20)])
        with pytest.raises(
            errors.ResourceExhausted, match="exceeded its submit quota of 2 tasks/s"
        ):
            await client.submit("q")
        assert (await other.submit("q")).created  # quotas are per namespace
        with pytest.raises(errors.ResourceExhausted, match="larger than the burst"):
            await other.submit_many([NewTask(queue="q") for _ in range(21)])
        await asyncio.sleep(0.6)
        assert (await client.submit("q")).created  # refilled at 2/s
    finally:
        await client.close()
        await other.close()
