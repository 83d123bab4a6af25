"""The streaming worker protocol (``Work``): tasks pushed within credits, acks answered on
the same call, nothing lost when a stream breaks, bad streams refused (real node, real store)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import pytest

from chronoq.api.v1 import worker_pb2, worker_pb2_grpc
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.clock import ManualClock
from chronoq.limits import MAX_STREAM_CREDITS
from chronoq.models import Lease, TaskState
from chronoq.node import Node
from chronoq.node.edge.worker_service import WorkerService
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled
from tests.integration.test_riding_claims import run_flow

pytestmark = pytest.mark.timeout(90)


class RawStream:
    """A ``Work`` call driven by hand: what a worker of another language would send."""

    def __init__(self, node: Node) -> None:
        self.channel = grpc.aio.insecure_channel(node.address)
        self.call: Any = worker_pb2_grpc.WorkerServiceStub(self.channel).Work()  # type: ignore[no-untyped-call]
        # Reads go through a queue: a read cancelled by a timeout would cancel the call.
        self.responses: asyncio.Queue[Any] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while (response := await self.call.read()) is not grpc.aio.EOF:
                await self.responses.put(response)

    async def send(self, **fields: Any) -> None:
        await self.call.write(worker_pb2.WorkRequest(**fields))

    async def open(self, queues: list[str], credits: int, worker_id: str = "raw") -> None:
        await self.send(
            open=worker_pb2.WorkOpen(queues=queues, worker_id=worker_id), credits=credits
        )

    async def read(self, timeout: float = 5.0) -> worker_pb2.WorkResponse:
        async with asyncio.timeout(timeout):
            return await self.responses.get()  # type: ignore[no-any-return]

    async def tasks(self, count: int, timeout: float = 10.0) -> list[Any]:
        got: list[Any] = []
        while len(got) < count:
            got.extend((await self.read(timeout)).tasks)
        return got

    async def status(self) -> grpc.StatusCode:
        return await self.call.code()  # type: ignore[no-any-return]

    async def close(self) -> None:
        self.call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.channel.close()


@pytest.fixture
async def raw(node: Node) -> AsyncIterator[RawStream]:
    stream = RawStream(node)
    try:
        yield stream
    finally:
        await stream.close()


async def test_tasks_are_pushed_within_credits_and_acks_are_answered(
    client: Client, raw: RawStream
) -> None:
    await client.submit_many([NewTask(queue="push") for _ in range(5)])
    await raw.open(["push"], credits=2)
    first = await raw.tasks(2)
    assert len(first) == 2
    # No third task while the worker has no credit left.
    with pytest.raises(TimeoutError):
        await raw.read(timeout=0.5)
    await raw.send(credits=3)
    rest = await raw.tasks(3)
    pushed = first + rest
    assert len({t.id for t in pushed}) == 5
    for t in pushed:
        task = await client.get(t.id)
        assert task.state is TaskState.RUNNING and task.worker_id == "raw" and task.attempt == 1

    leases = [worker_pb2.Lease(task_id=t.id, lease_token=t.attempt) for t in pushed]
    await raw.send(complete=leases[:3], ack_seq=7)
    await raw.send(complete=leases[3:], ack_seq=8)
    answers = {}
    while len(answers) < 2:
        response = await raw.read()
        answers[response.ack_seq] = [(r.task_id, r.ok) for r in response.acked]
    assert answers[7] == [(t.id, True) for t in pushed[:3]]
    assert answers[8] == [(t.id, True) for t in pushed[3:]]
    for t in pushed:
        assert (await client.get(t.id)).state is TaskState.SUCCEEDED


async def test_a_waiting_stream_gets_a_task_as_soon_as_it_is_submitted(
    client: Client, raw: RawStream
) -> None:
    await raw.open(["later"], credits=10)
    await asyncio.sleep(0.3)  # the stream waits in the node's long-poll
    submitted = await client.submit("later")
    (task,) = await raw.tasks(1)
    assert task.id == submitted.task.id


async def test_a_stream_that_breaks_mid_task_loses_nothing(
    node: Node, client: Client, clock: ManualClock
) -> None:
    await client.submit_many(
        [
            NewTask(
                queue="cut",
                lease_timeout=timedelta(seconds=5),
                backoff_initial=timedelta(0),
                backoff_max=timedelta(0),
            )
            for _ in range(3)
        ]
    )
    stream = RawStream(node)
    await stream.open(["cut"], credits=3)
    pushed = await stream.tasks(3)
    await stream.close()  # the worker's connection drops while it runs them

    # Pushed tasks stay leased to the worker: it may still ack them by another way.
    done, *_ = pushed
    (outcome,) = await client.complete_many([_lease(done)])
    assert outcome.ok
    # The others come back when their leases expire, at their next attempt.
    clock.advance(timedelta(seconds=6))
    assert node.reaper is not None
    reaped = {t.id for t in await node.reaper.reap()}
    assert reaped == {t.id for t in pushed[1:]}
    again = await client.claim(["cut"], worker_id="next", max_tasks=10)
    assert {(t.id, t.attempt) for t in again} == {(t.id, 2) for t in pushed[1:]}


async def test_a_bad_stream_is_refused_with_a_message(node: Node, client: Client) -> None:
    await client.submit_many([NewTask(queue="bad") for _ in range(2)])
    cases: list[tuple[dict[str, Any], ...]] = [
        ({"credits": 1},),  # no open first
        ({"open": worker_pb2.WorkOpen(queues=[])},),
        ({"open": worker_pb2.WorkOpen(queues=["bad"])}, {"open": worker_pb2.WorkOpen()}),
        ({"open": worker_pb2.WorkOpen(queues=["bad"]), "credits": MAX_STREAM_CREDITS + 1},),
        (
            {"open": worker_pb2.WorkOpen(queues=["none"])},
            {"complete": [worker_pb2.Lease(task_id="x", lease_token=1)]},  # no ack_seq
        ),
    ]
    for messages in cases:
        stream = RawStream(node)
        try:
            for message in messages:
                await stream.send(**message)
            assert await stream.status() is grpc.StatusCode.INVALID_ARGUMENT, messages
            assert await stream.call.details(), messages
        finally:
            await stream.close()
    # Nothing was claimed by the refused streams.
    listed = await client.list(queue="bad")
    assert {t.state for t in listed.tasks} == {TaskState.READY}


async def test_a_streaming_worker_runs_each_task_once(client: Client) -> None:
    stats = await run_flow(client, 400)
    assert stats.claimed_on_ack == 0  # every task came pushed on the stream


async def test_a_worker_falls_back_to_claims_on_a_node_without_streams(
    make_node: NodeFactory, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(WorkerService, "Work", worker_pb2_grpc.WorkerServiceServicer.Work)
    node = await make_node(clock=clock)
    async with Client(node.address, timeout=10) as client:
        await client.submit_many([NewTask(queue="old") for _ in range(20)])
        done = asyncio.Event()
        seen: set[str] = set()

        async def handler(ctx: TaskContext) -> None:
            seen.add(ctx.id)
            if len(seen) == 20:
                done.set()

        worker = Worker(client, {"old": handler}, concurrency=4)
        run = asyncio.create_task(worker.run())
        try:
            async with asyncio.timeout(20):
                await done.wait()
        finally:
            worker.stop()
            stats = await run
    assert not worker.stream  # it noticed, and long-polled instead
    assert stats.succeeded == 20


async def test_a_task_fired_on_one_node_reaches_a_stream_on_another(
    make_node: NodeFactory, etcd: Any, cluster_name: str
) -> None:
    settings = cluster(etcd, cluster_name)
    nodes = [
        await make_node(cluster=settings, node_id=f"n{i}", claim_poll=timedelta(seconds=30))
        for i in range(2)
    ]
    await settled(nodes)
    for streaming, submitting in ((nodes[0], nodes[1]), (nodes[1], nodes[0])):
        stream = RawStream(streaming)
        try:
            await stream.open(["far"], credits=5)
            async with Client(submitting.address) as submitter:
                due = await submitter.submit("far", delay=timedelta(milliseconds=300))
                (task,) = await stream.tasks(1, timeout=10)
            late = time.time() - due.task.run_at.timestamp()
            assert task.id == due.task.id
            assert late < 5.0, f"pushed {late:.1f} s after run_at"  # not by the 30 s re-check
        finally:
            await stream.close()


def _lease(task: Any) -> Lease:
    return Lease(task.id, task.attempt)
