"""Namespaces share a node without hurting each other: long-polls, listings, revoked tokens.

Real node, real PostgreSQL. Timing bounds are generous (a second where the promise is "under a
second"): they catch starvation measured in seconds, not a busy machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import asyncpg
import grpc
import pytest

from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc, worker_pb2, worker_pb2_grpc
from chronoq.client import Client, NewTask
from chronoq.errors import AccessDenied
from chronoq.models import TaskState
from chronoq.node import Node
from chronoq.store.store import PAGE_BYTES
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(180)

LONG_POLLS = 1000
TOKEN_A = "team-a-token-0123456789abcdef"
TOKEN_B = "team-b-token-fedcba9876543210"


async def until(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        outcome = predicate()
        if outcome if isinstance(outcome, bool) else await outcome:
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def claim_request(namespace: str, queue: str, wait: float) -> worker_pb2.ClaimRequest:
    return worker_pb2.ClaimRequest(
        namespace=namespace, queues=[queue], wait=convert.to_duration(timedelta(seconds=wait))
    )


@pytest.fixture
async def channels() -> AsyncIterator[Callable[[str], grpc.aio.Channel]]:
    opened: list[grpc.aio.Channel] = []

    def open_channel(address: str) -> grpc.aio.Channel:
        opened.append(grpc.aio.insecure_channel(address))
        return opened[-1]

    yield open_channel
    for channel in opened:
        await channel.close()


async def test_a_thousand_long_polls_do_not_starve_another_namespace(
    make_node: NodeFactory, channels: Callable[[str], grpc.aio.Channel]
) -> None:
    node = await make_node(
        claim_poll=timedelta(milliseconds=500),
        long_polls_per_namespace=LONG_POLLS,
        long_polls_per_node=LONG_POLLS + 10,
    )
    stub = worker_pb2_grpc.WorkerServiceStub(channels(node.address))
    waiting = [
        asyncio.ensure_future(stub.Claim(claim_request("team-a", "idle", 60), timeout=90))
        for _ in range(LONG_POLLS)
    ]
    async with Client(node.address, namespace="team-b", timeout=10) as b:
        try:
            await until(lambda: node.notifier.waiting().get(("team-a", "idle")) == LONG_POLLS, 30)
            worst = 0.0
            for _ in range(5):
                started = time.perf_counter()
                sub = await b.submit("work")
                await b.get(sub.task.id)
                (claimed,) = await b.claim(["work"], wait=timedelta(seconds=5))
                assert claimed.id == sub.task.id
                worst = max(worst, time.perf_counter() - started)
            # A task that comes due is fired by the node and reaches B's waiting claim.
            due = await b.submit("later", delay=timedelta(milliseconds=500))
            (claimed,) = await b.claim(["later"], wait=timedelta(seconds=10))
            late = time.time() - due.task.run_at.timestamp()
            print(
                f"\nB submit+get+claim worst {worst * 1000:.0f} ms; due task claimed {late * 1000:.0f} ms late"
            )
            assert claimed.id == due.task.id
            assert worst < 1.0
            assert late < 1.0
            assert not any(w.done() for w in waiting)  # A's long-polls are still waiting
        finally:
            for w in waiting:
                w.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
    await until(lambda: len(node.notifier) == 0)  # their wake-up state is gone with them


async def test_long_polls_over_the_caps_are_refused(
    make_node: NodeFactory, channels: Callable[[str], grpc.aio.Channel]
) -> None:
    node = await make_node(long_polls_per_namespace=3, long_polls_per_node=5)
    stub = worker_pb2_grpc.WorkerServiceStub(channels(node.address))
    open_calls = [
        asyncio.ensure_future(stub.Claim(claim_request("team-a", "q", 30), timeout=40))
        for _ in range(3)
    ]
    try:
        await until(lambda: node.notifier.waiting().get(("team-a", "q")) == 3)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Claim(claim_request("team-a", "q", 30), timeout=40)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "namespace 'team-a' has 3 long-polling claims open" in refused.value.details()
        # A claim that does not wait is no long-poll: still served.
        await stub.Claim(claim_request("team-a", "q", 0), timeout=10)
        open_calls += [
            asyncio.ensure_future(stub.Claim(claim_request("team-b", "q", 30), timeout=40))
            for _ in range(2)
        ]
        await until(lambda: node.notifier.waiting().get(("team-b", "q")) == 2)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Claim(claim_request("team-c", "q", 30), timeout=40)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "this node has 5 long-polling claims open" in refused.value.details()
    finally:
        for call in open_calls:
            call.cancel()
        await asyncio.gather(*open_calls, return_exceptions=True)
    # Slots are given back when calls end.
    await until(lambda: len(node.notifier) == 0)
    response = await asyncio.wait_for(stub.Claim(claim_request("team-c", "q", 0.2), timeout=10), 10)
    assert not response.tasks


async def test_a_long_poll_ends_before_the_callers_deadline(
    make_node: NodeFactory, channels: Callable[[str], grpc.aio.Channel]
) -> None:
    node = await make_node()
    stub = worker_pb2_grpc.WorkerServiceStub(channels(node.address))
    started = time.perf_counter()
    response = await stub.Claim(claim_request("default", "q", 30), timeout=3)
    assert not response.tasks  # an empty answer in time, not DEADLINE_EXCEEDED
    assert time.perf_counter() - started < 3


@pytest.mark.parametrize("gone", ["cancelled", "deadline"])
async def test_a_task_claimed_for_a_caller_that_left_is_given_back_at_once(
    make_node: NodeFactory, dsn: str, channels: Callable[[str], grpc.aio.Channel], gone: str
) -> None:
    node = await make_node()
    async with Client(node.address, timeout=10) as client:
        await client.set_queue_limit("q", 1000, 1000)
        sub = await client.submit("q")
        stub = worker_pb2_grpc.WorkerServiceStub(channels(node.address))
        # Hold the queue's dispatch-limit row: the claim blocks inside its statement, so the
        # caller leaves while the claim is in flight, and the claim then commits.
        blocker = await asyncpg.connect(dsn)
        try:
            async with blocker.transaction():
                await blocker.execute("SELECT * FROM queue_limits FOR UPDATE")
                call = stub.Claim(
                    claim_request("default", "q", 30), timeout=1.0 if gone == "deadline" else 30
                )
                pending = asyncio.ensure_future(call)

                async def claim_blocked() -> bool:
                    n = await blocker.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                    return bool(n)

                await until(claim_blocked)
                if gone == "cancelled":
                    pending.cancel()
                with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)):
                    await pending
        finally:
            await blocker.close()
        # The claim went through after its caller left; the node gave the task straight back
        # (no lease to wait out), without using an attempt.
        await until(lambda: _released(node, sub.task.id), 5)
        task = await client.get(sub.task.id)
        assert task.worker_id in (None, "") and task.lease_until is None
        (again,) = await client.claim(["q"])
        assert again.id == sub.task.id


async def _released(node: Node, task_id: str) -> bool:
    """Claimed once (attempt 1), then READY again with that attempt not counted."""
    assert node.store is not None
    task = await node.store.get(task_id, "default")
    return task.state is TaskState.READY and task.attempt == 1 and task.retry_base == 1


async def test_listing_big_payloads_returns_pages_bounded_in_bytes(
    make_node: NodeFactory, channels: Callable[[str], grpc.aio.Channel]
) -> None:
    node = await make_node()
    payload = b"x" * (256 * 1024)
    async with Client(node.address, namespace="big", timeout=30) as client:
        for _ in range(4):
            await client.submit_ids(
                [NewTask(queue="q", payload=payload, delay=timedelta(hours=1)) for _ in range(10)]
            )
    stub = tasks_pb2_grpc.TaskServiceStub(channels(node.address))
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await stub.ListTasks(
            tasks_pb2.ListTasksRequest(namespace="big", page_size=1000, page_token=token),
            timeout=30,
        )
        pages += 1
        assert page.ByteSize() <= PAGE_BYTES  # within the 4 MiB any gRPC client accepts
        seen += [t.id for t in page.tasks]
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == 40
    assert pages >= 4  # 10 MiB of payloads in pages of at most 3 MiB


async def test_revoking_a_token_ends_its_open_long_poll(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{TOKEN_A}" = ["team-a"]\n"{TOKEN_B}" = ["team-b"]\n')
    tokens.chmod(0o600)
    node = await make_node(auth_tokens=str(tokens))
    a = Client(node.address, namespace="team-a", token=TOKEN_A, timeout=10)
    b = Client(node.address, namespace="team-b", token=TOKEN_B, timeout=10)
    try:
        a_poll = asyncio.ensure_future(a.claim(["q"], wait=timedelta(seconds=30)))
        b_poll = asyncio.ensure_future(b.claim(["q"], wait=timedelta(seconds=30)))
        await until(lambda: len(node.notifier) == 2)
        tokens.write_text(f'[tokens]\n"{TOKEN_B}" = ["team-b"]\n')
        revoked = time.perf_counter()
        with pytest.raises(AccessDenied) as ended:
            await asyncio.wait_for(a_poll, 10)
        print(
            f"\nopen long-poll ended {(time.perf_counter() - revoked) * 1000:.0f} ms after revocation"
        )
        assert ended.value.code == "UNAUTHENTICATED"
        assert "revoked" in ended.value.message
        assert not b_poll.done()  # the other token's call goes on
        b_poll.cancel()
        await asyncio.gather(b_poll, return_exceptions=True)
        with pytest.raises(AccessDenied):
            await a.get("00000000-0000-0000-0000-000000000000")
    finally:
        await a.close()
        await b.close()
