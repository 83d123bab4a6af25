"""The largest requests a node accepts do not hold its event loop for long.

The figures are printed (run with ``-s``); the bound asserted is loose on purpose (a shared
test machine), and still far below what one unsliced conversion of such a request took.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import grpc
import pytest

from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2, worker_pb2
from chronoq.limits import MAX_LEASES_PER_CALL
from tests.integration.conftest import NodeFactory

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


class LagMonitor:
    """The longest the event loop went without running a 1 ms timer: in wall time, and in CPU
    time of the loop's thread (what the node itself spent; on a busy shared machine the wall
    time also counts the time the process was not scheduled at all)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_cpu = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            started, started_cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - started - 0.001)
            self.worst_cpu = max(self.worst_cpu, time.thread_time() - started_cpu)

    async def __aenter__(self) -> LagMonitor:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0.01)
        self.worst = self.worst_cpu = 0.0
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def raw_call(address: str, method: str, request: bytes) -> bytes:
    """One call from a plain (blocking) channel, bytes in and out: the caller's own work then
    neither runs on the node's event loop nor holds the interpreter for long."""
    with grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)]
    ) as channel:
        response: bytes = channel.unary_unary(method)(request, timeout=120)
        return response


async def test_largest_requests_stall_the_loop_briefly(make_node: NodeFactory) -> None:
    node = await make_node()
    batch = tasks_pb2.SubmitBatchRequest(
        tasks=[
            tasks_pb2.TaskSpec(
                namespace="big",
                queue="q",
                payload=b"p" * 100,
                idempotency_key=f"key-{i:05}",
                delay=convert.to_duration(timedelta(0)),
            )
            for i in range(node.settings.max_batch)
        ]
    ).SerializeToString()
    listing = tasks_pb2.ListTasksRequest(namespace="big", page_size=1000).SerializeToString()
    claim = worker_pb2.ClaimRequest(namespace="big", queues=["q"], max_tasks=1000)
    heartbeat = worker_pb2.HeartbeatRequest(
        namespace="big",
        leases=[
            worker_pb2.Lease(task_id=str(uuid.uuid4()), lease_token=1)
            for _ in range(MAX_LEASES_PER_CALL)
        ],
    )
    calls = [
        ("SubmitBatch of max_batch tasks", "/chronoq.v1.TaskService/SubmitBatch", batch),
        ("ListTasks page of 1000", "/chronoq.v1.TaskService/ListTasks", listing),
        ("Claim of 1000", "/chronoq.v1.WorkerService/Claim", claim.SerializeToString()),
        (
            f"Heartbeat of {MAX_LEASES_PER_CALL} unknown leases",
            "/chronoq.v1.WorkerService/Heartbeat",
            heartbeat.SerializeToString(),
        ),
    ]
    print()
    for name, method, request in calls:
        async with LagMonitor() as lag:
            started = time.perf_counter()
            await asyncio.to_thread(raw_call, node.address, method, request)
            took = time.perf_counter() - started
        print(
            f"{name}: {took * 1000:.0f} ms; longest event-loop stall {lag.worst * 1000:.1f} ms"
            f" wall, {lag.worst_cpu * 1000:.1f} ms CPU"
        )
