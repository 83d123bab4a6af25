"""Acks that are not dropped, completes that are safe to repeat, and a client that keeps away
from nodes that cannot serve it (through real nodes on the session's PostgreSQL)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import timedelta

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoq import errors
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.client.picker import NodeHealth
from chronoq.client.pool import channel_options
from chronoq.embedded.postgres import free_port
from chronoq.models import Lease, Task, TaskState
from chronoq.node import Node
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(60)


async def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def claim(client: Client, queue: str, count: int) -> list[Task]:
    tasks: list[Task] = []
    for _ in range(50):
        tasks += await client.claim([queue], max_tasks=count - len(tasks), wait=timedelta(1))
        if len(tasks) == count:
            return tasks
    raise AssertionError(f"claimed {len(tasks)} of {count}")


async def test_a_repeated_complete_gets_the_same_answer(make_node: NodeFactory) -> None:
    node = await make_node()
    async with Client(node.address, timeout=5) as client:
        await client.submit_many([NewTask(queue="again") for _ in range(3)])
        leases = [Lease(t.id, t.attempt) for t in await claim(client, "again", 3)]

        first = await client.complete(leases[0])
        repeated = await client.complete(leases[0])
        assert first.state is TaskState.SUCCEEDED and repeated == first

        batch = await client.complete_many(leases)
        assert [(o.task_id, o.ok) for o in batch] == [(lease.task_id, True) for lease in leases]
        assert await client.complete_many(leases) == batch

        # Only the attempt that completed the task gets the answer again.
        other = Lease(leases[1].task_id, leases[1].lease_token + 1)
        with pytest.raises(errors.PreconditionFailed):
            await client.complete(other)
        (refused,) = await client.complete_many([other])
        assert not refused.ok and "SUCCEEDED" in refused.error


@pytest.fixture
def gated() -> tuple[asyncio.Event, asyncio.Event, list[str]]:
    return asyncio.Event(), asyncio.Event(), []


def gated_handler(started: asyncio.Event, gate: asyncio.Event, ran: list[str]):  # type: ignore[no-untyped-def]
    async def handler(ctx: TaskContext) -> None:
        ran.append(ctx.id)
        started.set()
        await gate.wait()

    return handler


async def test_a_failed_ack_is_sent_again_until_it_lands(make_node: NodeFactory) -> None:
    """The node goes away while the handler runs: the ack fails, is retried, and lands once
    a node serves again; the task is not run a second time."""
    node = await make_node()
    started, gate, ran = asyncio.Event(), asyncio.Event(), []
    async with Client(node.address, timeout=5) as client:
        sub = await client.submit("acks")
        worker = Worker(
            client,
            {"acks": gated_handler(started, gate, ran)},
            concurrency=1,
            claim_wait=timedelta(milliseconds=200),
        )
        run = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 10)
        await node.stop(grace=0.1)  # the task stays RUNNING under the worker's lease
        gate.set()

        async def retried() -> bool:
            return worker.stats.ack_retries >= 2

        await until(retried)
        await make_node(port=node.port)  # a node again on the same address

        async def succeeded() -> bool:
            try:
                return (await client.get(sub.task.id)).state is TaskState.SUCCEEDED
            except errors.Unavailable:
                return False

        await until(succeeded, timeout=15)
        worker.stop()
        stats = await asyncio.wait_for(run, 15)
        task = await client.get(sub.task.id)
    assert stats.acks_dropped == 0 and stats.succeeded == 1
    assert task.attempt == 1 and ran == [sub.task.id]


async def test_an_ack_is_given_up_only_when_its_lease_runs_out(
    make_node: NodeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    node = await make_node()
    started, gate, ran = asyncio.Event(), asyncio.Event(), []
    async with Client(node.address, timeout=5) as client:
        await client.submit("short", lease_timeout=timedelta(seconds=2))
        worker = Worker(
            client,
            {"short": gated_handler(started, gate, ran)},
            concurrency=1,
            claim_wait=timedelta(milliseconds=200),
        )
        run = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 10)
        await node.stop(grace=0.1)  # and it does not come back
        gate.set()
        worker.stop()
        loop = asyncio.get_running_loop()
        stopping = loop.time()
        with caplog.at_level(logging.WARNING, logger="chronoq.worker"):
            stats = await asyncio.wait_for(run, 15)
        waited = loop.time() - stopping
    assert stats.acks_dropped == 1 and stats.ack_retries >= 1
    assert waited < 4.0  # given up around the 2 s lease's end (generous on a busy machine)
    assert any("gave up acknowledging 1 tasks" in r.getMessage() for r in caplog.records)


async def test_client_keepalive_pings_are_welcome(node: Node) -> None:
    """Clients ping every second; the node must not answer GOAWAY too_many_pings (which
    would break every stream it has open, as this idle health stream)."""
    channel = grpc.aio.insecure_channel(node.address, options=channel_options())
    try:
        call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        first = await call.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        await asyncio.sleep(4.5)  # a node allowing a ping per 5 s breaks the stream at ~3 s
        assert not call.done()
        assert channel.get_state() is grpc.ChannelConnectivity.READY
        call.cancel()
    finally:
        await channel.close()


async def test_a_node_that_is_not_serving_gets_no_calls_until_it_recovers(
    make_node: NodeFactory,
) -> None:
    a = await make_node(node_id="node-a")
    b = await make_node(node_id="node-b")
    async with Client(f"{a.address},{b.address}", timeout=5) as client:

        async def served_by(count: int = 12) -> Counter[str]:
            return Counter([(await client.status()).node_id for _ in range(count)])

        async def health_of_a(health: NodeHealth):  # type: ignore[no-untyped-def]
            async def seen() -> bool:
                await client.status()  # the client follows health from its first call
                return client._pool.picker.nodes[0].health is health

            await until(seen)

        await health_of_a(NodeHealth.SERVING)
        assert set(await served_by()) == {"node-a", "node-b"}
        await a._set_serving(False)
        await health_of_a(NodeHealth.NOT_SERVING)
        assert await served_by() == Counter({"node-b": 12})
        await a._set_serving(True)
        await health_of_a(NodeHealth.SERVING)
        assert set(await served_by()) == {"node-a", "node-b"}


async def test_a_submit_that_fails_on_one_node_is_retried_on_another_without_duplicates(
    make_node: NodeFactory,
) -> None:
    node = await make_node()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    async with Client(f"{dead},{node.address}", timeout=5) as client:
        subs = [await client.submit("keyed", delay=timedelta(hours=1)) for _ in range(4)]
        listed = (await client.list(queue="keyed")).tasks
    assert client.failovers >= 1  # the first call went to the dead address
    # Each submit got a key of the client's making, so a retry could not create it twice.
    assert all(s.created and s.task.idempotency_key for s in subs)
    assert sorted(t.id for t in listed) == sorted(s.task.id for s in subs)
