"""The SDK's conveniences against a real node: the blocking client shared by threads, JSON
payloads end to end, and task definitions with their defaults.

The node runs on the test's event loop, so every blocking call here runs in other threads
(``asyncio.to_thread``), as it would in a web server's worker threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from chronoq import errors
from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc
from chronoq.client import Client, SyncClient, TaskContext, TaskRegistry, Worker
from chronoq.models import APPLICATION_JSON, OCTET_STREAM, MisfirePolicy, TaskState
from chronoq.node import Node
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(60)

THREADS = 8
SUBMITS_PER_THREAD = 10


@pytest.fixture
async def live(make_node: NodeFactory) -> Node:
    return await make_node()  # system clock: workers see tasks come due


@pytest.fixture
async def sync_client(live: Node) -> AsyncIterator[SyncClient]:
    client = await asyncio.to_thread(SyncClient, live.address, timeout=10)
    try:
        yield client
    finally:
        await asyncio.to_thread(client.close)


async def until(predicate: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_sync_client_is_shared_by_threads_at_once(sync_client: SyncClient) -> None:
    started = threading.Barrier(THREADS)

    def one_thread(n: int) -> list[str]:
        started.wait(5)  # all threads call at the same time
        ids = []
        for i in range(SUBMITS_PER_THREAD):
            sub = sync_client.submit("threads", payload={"thread": n, "i": i})
            assert sync_client.get(sub.task.id).queue == "threads"
            ids.append(sub.task.id)
        return ids

    def run_all() -> list[list[str]]:
        with ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(one_thread, range(THREADS)))

    results = await asyncio.to_thread(run_all)
    ids = [i for ids in results for i in ids]
    assert len(set(ids)) == THREADS * SUBMITS_PER_THREAD
    listed = await asyncio.to_thread(lambda: list(sync_client.iter_tasks(queue="threads")))
    assert {t.id for t in listed} == set(ids)


async def test_sync_client_raises_the_async_clients_errors(sync_client: SyncClient) -> None:
    with pytest.raises(errors.NotFound):
        await asyncio.to_thread(sync_client.get, "00000000-0000-4000-8000-000000000000")
    with pytest.raises(errors.BadRequest, match="queue"):
        await asyncio.to_thread(sync_client.submit, "bad queue!")
    # Refused before any call: JSON cannot hold a set.
    with pytest.raises(errors.PayloadNotJSON, match=r"payload\['tags'\]"):
        await asyncio.to_thread(sync_client.submit, "q", payload={"tags": {1, 2}})


async def test_closed_sync_client_refuses_calls(live: Node) -> None:
    client = await asyncio.to_thread(SyncClient, live.address)
    with client:
        await asyncio.to_thread(client.wait_ready, 5.0)
    with pytest.raises(errors.ConfigError, match="closed"):
        client.submit("q")
    client.close()  # twice is fine


async def test_json_payload_round_trip_through_a_worker(live: Node) -> None:
    value = {
        "name": "Zoë 🚀 — 東京",
        "nested": {"list": [1, 2.5, None, True, {"deep": ["a", {"b": []}]}], "empty": {}},
        "escape": 'quote " back\\slash \n newline',
    }
    got: dict[str, tuple[Any, str, bytes]] = {}

    async def handler(ctx: TaskContext) -> None:
        got[ctx.id] = (ctx.data, ctx.content_type, ctx.payload)

    async with Client(live.address) as client:
        as_json = await client.submit("json", payload=value)
        as_bytes = await client.submit("json", payload=b"\x00raw")
        assert as_json.task.content_type == APPLICATION_JSON
        assert as_bytes.task.content_type == OCTET_STREAM
        assert (await client.get(as_json.task.id)).content_type == APPLICATION_JSON
        worker = Worker(client, {"json": handler}, claim_wait=timedelta(milliseconds=200))
        run = asyncio.create_task(worker.run())

        async def both() -> bool:
            return len(got) == 2

        try:
            await until(both)
        finally:
            worker.stop()
            await run
    assert got[as_json.task.id][:2] == (value, APPLICATION_JSON)
    assert got[as_bytes.task.id] == (b"\x00raw", OCTET_STREAM, b"\x00raw")


async def test_a_json_task_whose_bytes_are_not_json_goes_dead_at_once(live: Node) -> None:
    """Retrying cannot change the stored bytes: reading ``ctx.data`` fails the task for good."""

    async def handler(ctx: TaskContext) -> None:
        ctx.data  # noqa: B018 - reading it is the point

    async with Client(live.address) as client:
        sub = await client.submit(
            "badjson", payload=b"{not json", content_type=APPLICATION_JSON, max_attempts=5
        )
        worker = Worker(client, {"badjson": handler}, claim_wait=timedelta(milliseconds=200))
        run = asyncio.create_task(worker.run())

        async def dead() -> bool:
            return (await client.get(sub.task.id)).state is TaskState.DEAD

        try:
            await until(dead)
        finally:
            worker.stop()
            await run
        task = await client.get(sub.task.id)
    assert task.attempt == 1 and "not JSON" in (task.last_error or "")


async def test_node_checks_the_content_type(live: Node) -> None:
    async with grpc.aio.insecure_channel(live.address) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)

        async def submit(content_type: str) -> Any:
            spec = tasks_pb2.TaskSpec(queue="ct", payload=b"x", content_type=content_type)
            spec.delay.FromTimedelta(timedelta(0))
            return await stub.Submit(tasks_pb2.SubmitRequest(task=spec))

        for bad in ("json", "text/plain\x00", "a/" + "b" * 200, "text/plain; charset"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await submit(bad)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "content_type" in (refused.value.details() or "")
        ok = await submit("text/plain; charset=utf-8")
        assert ok.task.content_type == "text/plain; charset=utf-8"
        old_client = await submit("")  # a client from before the field: bytes
        assert old_client.task.content_type == OCTET_STREAM


async def test_task_definitions_apply_defaults_and_take_overrides(
    live: Node, sync_client: SyncClient
) -> None:
    tasks = TaskRegistry(sync_client)
    ran: list[Any] = []

    @tasks.task(
        queue="emails",
        max_attempts=7,
        lease_timeout=timedelta(seconds=45),
        misfire_policy=MisfirePolicy.SKIP,
        misfire_grace=timedelta(seconds=5),
    )
    def send_email(ctx: TaskContext) -> None:
        ran.append(ctx.data)

    at = datetime.now(UTC) + timedelta(milliseconds=300)
    first = await asyncio.to_thread(
        lambda: send_email.schedule(at=at, payload={"to": "a@example.com"})
    )
    second = await asyncio.to_thread(
        lambda: send_email.schedule_in(
            timedelta(milliseconds=100), payload={"to": "b@example.com"}, max_attempts=2
        )
    )
    async with Client(live.address) as client:
        third = await send_email.aschedule_in(
            timedelta(0), payload={"to": "c@example.com"}, client=client, priority=5
        )
        fourth = await send_email.aschedule(payload={"to": "d@example.com"})  # via the sync one
        for sub in (first, second, third, fourth):
            task = sub.task
            assert task.queue == "emails"
            assert task.lease_timeout == timedelta(seconds=45)
            assert task.misfire_policy is MisfirePolicy.SKIP
            assert task.misfire_grace == timedelta(seconds=5)
        assert first.task.run_at == at
        assert [s.task.max_attempts for s in (first, second, third, fourth)] == [7, 2, 7, 7]
        assert third.task.priority == 5

        worker = tasks.worker(client, claim_wait=timedelta(milliseconds=200))
        run = asyncio.create_task(worker.run())

        async def all_ran() -> bool:
            return len(ran) == 4

        try:
            await until(all_ran)
        finally:
            worker.stop()
            await run
        assert sorted(r["to"] for r in ran) == [f"{c}@example.com" for c in "abcd"]
        state = (await client.get(first.task.id)).state
        assert state is TaskState.SUCCEEDED


async def test_run_worker_blocks_until_stopped(live: Node, sync_client: SyncClient) -> None:
    tasks = TaskRegistry(sync_client)
    done = threading.Event()

    @tasks.task
    def ping(ctx: TaskContext) -> None:
        done.set()

    stop = threading.Event()
    worker = asyncio.create_task(
        asyncio.to_thread(
            tasks.run_worker, live.address, stop=stop, claim_wait=timedelta(milliseconds=200)
        )
    )
    try:
        await asyncio.to_thread(ping.schedule)
        assert await asyncio.to_thread(done.wait, 15)
    finally:
        stop.set()
        stats = await asyncio.wait_for(worker, 20)
    assert stats.succeeded == 1
