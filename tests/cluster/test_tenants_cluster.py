"""A cluster keeps its ownership while one node serves a thousand long-polls and big calls.

Node processes on the session's etcd and PostgreSQL, lease TTL 2 s: a node whose event loop
stalls for a second or so hands its partitions off (new fencing tokens in the store).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import timedelta

import grpc
import pytest

from chronoq.api import convert
from chronoq.api.v1 import worker_pb2, worker_pb2_grpc
from chronoq.client import Client
from chronoq.limits import MAX_LEASES_PER_CALL
from chronoq.local.cluster import LocalCluster
from chronoq.store import Store
from tests.cluster.conftest import ClusterFactory

pytestmark = pytest.mark.timeout(240)

NAMESPACES = [f"crowd-{i}" for i in range(4)]
PER_NAMESPACE = 250  # 1,000 long-polls on one node, within its default caps
LOAD_SECONDS = 12.0


async def _tokens(store: Store) -> dict[int, tuple[str, int]]:
    return {f.partition: (f.owner, f.token) for f in await store.fences()}


async def _settled(store: Store, partitions: int, quiet: float = 3.0) -> dict[int, tuple[str, int]]:
    """The owners and fencing tokens once they stayed the same for ``quiet`` seconds."""
    deadline = time.monotonic() + 60
    last = await _tokens(store)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet)
        now = await _tokens(store)
        if now == last and len(now) == partitions:
            return now
        last = now
    raise AssertionError("ownership did not settle within 60 s")


def _cpu_seconds(cluster: LocalCluster, node_id: str) -> float:
    pid = cluster.nodes[node_id].pid
    assert pid is not None
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_ownership_holds_under_a_thousand_long_polls_and_big_heartbeats(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(nodes=3)
    target = cluster.nodes["node-0"].address
    store = await Store.connect(cluster.dsn, partitions=16, min_size=1, max_size=2)
    channel = grpc.aio.insecure_channel(target)
    stub = worker_pb2_grpc.WorkerServiceStub(channel)
    other = Client(target, namespace="quiet", timeout=30)
    polls: list[asyncio.Future[worker_pb2.ClaimResponse]] = []
    heartbeat = worker_pb2.HeartbeatRequest(
        namespace="crowd-0",
        leases=[
            worker_pb2.Lease(task_id=str(uuid.uuid4()), lease_token=1)
            for _ in range(MAX_LEASES_PER_CALL)
        ],
    )
    try:
        await other.wait_ready()
        before = await _settled(store, 16)
        cpu_before = _cpu_seconds(cluster, "node-0")
        for namespace in NAMESPACES:
            request = worker_pb2.ClaimRequest(
                namespace=namespace,
                queues=["idle"],
                wait=convert.to_duration(timedelta(seconds=LOAD_SECONDS + 30)),
            )
            polls += [
                asyncio.ensure_future(stub.Claim(request, timeout=LOAD_SECONDS + 60))
                for _ in range(PER_NAMESPACE)
            ]
        ended = time.monotonic() + LOAD_SECONDS
        latencies: list[float] = []
        beats = 0
        while time.monotonic() < ended:
            started = time.perf_counter()
            beating = stub.Heartbeat(heartbeat, timeout=30)
            sub = await other.submit("work")
            (claimed,) = await other.claim(["work"], wait=timedelta(seconds=10))
            assert claimed.id == sub.task.id
            latencies.append(time.perf_counter() - started)
            await beating
            beats += 1
        after = await _tokens(store)
        cpu = _cpu_seconds(cluster, "node-0") - cpu_before
        latencies.sort()
        print(
            f"\n{len(polls)} long-polls and {beats} heartbeats of {MAX_LEASES_PER_CALL} leases"
            f" on one node for {LOAD_SECONDS:.0f} s: it used {cpu:.1f} s of CPU; another"
            f" namespace's submit+claim p50 {latencies[len(latencies) // 2] * 1000:.0f} ms,"
            f" max {latencies[-1] * 1000:.0f} ms"
        )
        assert not any(p.done() for p in polls)  # all still waiting: none refused or failed
        assert after == before  # no partition changed owner: no lease lost, no handoff
    finally:
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        await channel.close()
        await other.close()
        await store.close()
