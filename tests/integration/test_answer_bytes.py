"""Every answer and every push is bounded in bytes, and a worker stream in time (real node,
real store, raw gRPC calls with a client's default settings: a 4 MiB receive limit).

The attacks: claims of a queue of large tasks (each answer must fit; the queue must drain,
no attempt burnt), a stream whose worker never reads (closed at its write deadline, what it
had not delivered READY again at its attempt), streams that never send their open message
(closed at their deadline, capped per node and per token), and a SubmitBatch whose full
answer could not be read (refused before anything is written; the SDK splits it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc, worker_pb2, worker_pb2_grpc
from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.coordinator.local import LocalOwnership
from chronoq.limits import MAX_ANSWER_BYTES
from chronoq.models import TaskSpec, TaskState
from chronoq.node import Node
from chronoq.node.dispatch import work_stream
from chronoq.node.dispatch.work_stream import Openings
from chronoq.store import Store
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(120)

BIG = 256 * 1024  # the default payload limit
#: What a client accepts by default (gRPC's 4 MiB receive limit).
CLIENT_LIMIT = 4 * 1024 * 1024
TEAM_A = "team-a-secret-0123456789"
TEAM_B = "team-b-secret-9876543210"


async def submit_big(client: Client, queue: str, n: int) -> set[str]:
    ids = await client.submit_ids([NewTask(queue=queue, payload=b"x" * BIG) for _ in range(n)])
    return {i for i, _created in ids}


async def states(node: Node, queue: str) -> dict[str, tuple[TaskState, int]]:
    """Each task's state and the attempts it used (a given-back attempt is not used), from
    the store (the wire does not carry the attempts given back)."""
    assert node.store is not None
    out: dict[str, tuple[TaskState, int]] = {}
    token = ""
    while True:
        page = await node.store.list_tasks("default", queue=queue, page_token=token)
        out |= {t.id: (t.state, t.attempt - t.retry_base) for t in page.tasks}
        token = page.next_token
        if not token:
            return out


@contextlib.asynccontextmanager
async def plain_channel(node: Node) -> AsyncIterator[Any]:
    """A channel with gRPC's default options (the 4 MiB receive limit)."""
    async with grpc.aio.insecure_channel(node.address) as channel:
        yield channel


async def test_claims_of_large_tasks_fit_a_default_client_and_drain_the_queue(
    client: Client, node: Node
) -> None:
    ids = await submit_big(client, "big", 40)  # 10 MiB: one claim of all could not be sent
    claimed: dict[str, int] = {}
    async with plain_channel(node) as channel:
        workers = worker_pb2_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(40):
            answer = await workers.Claim(
                worker_pb2.ClaimRequest(queues=["big"], max_tasks=1000, worker_id="w")
            )
            if not answer.tasks:
                break
            assert answer.ByteSize() <= MAX_ANSWER_BYTES < CLIENT_LIMIT
            claimed |= {t.id: t.attempt for t in answer.tasks}
    assert set(claimed) == ids and set(claimed.values()) == {1}  # each once, first attempt


async def test_a_claim_riding_on_acks_fits_a_default_client(client: Client, node: Node) -> None:
    ids = await submit_big(client, "ride", 30)
    seen: set[str] = set()
    leases: list[worker_pb2.Lease] = []
    async with plain_channel(node) as channel:
        workers = worker_pb2_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(30):
            answer = await workers.CompleteBatch(
                worker_pb2.CompleteBatchRequest(
                    leases=leases,
                    claim=worker_pb2.ClaimRequest(queues=["ride"], max_tasks=1000),
                )
            )
            assert answer.ByteSize() <= CLIENT_LIMIT
            assert all(r.ok for r in answer.results)
            if not answer.claimed and not leases:
                break
            seen |= {t.id for t in answer.claimed}
            leases = [worker_pb2.Lease(task_id=t.id, lease_token=t.attempt) for t in answer.claimed]
    assert seen == ids
    assert {s for s, _a in (await states(node, "ride")).values()} == {TaskState.SUCCEEDED}


async def test_a_stream_drains_a_queue_of_large_tasks(client: Client, node: Node) -> None:
    ids = await submit_big(client, "flow", 40)
    got: set[str] = set()
    async with plain_channel(node) as channel:
        call = worker_pb2_grpc.WorkerServiceStub(channel).Work()  # type: ignore[no-untyped-call]
        await call.write(
            worker_pb2.WorkRequest(
                open=worker_pb2.WorkOpen(queues=["flow"], worker_id="w"), credits=1000
            )
        )
        async with asyncio.timeout(30):
            while got != ids:
                message = await call.read()
                assert message is not grpc.aio.EOF
                assert message.ByteSize() <= MAX_ANSWER_BYTES + BIG  # one task may pass it
                got |= {t.id for t in message.tasks}
        call.cancel()


async def test_a_stream_that_never_reads_is_closed_and_gives_its_tasks_back(
    client: Client, node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work_stream, "STREAM_WRITE_DEADLINE", 1.0)
    ids = await submit_big(client, "stuck", 60)  # 15 MiB, far more than a transport buffers
    async with plain_channel(node) as channel:
        call = worker_pb2_grpc.WorkerServiceStub(channel).Work()  # type: ignore[no-untyped-call]
        await call.write(
            worker_pb2.WorkRequest(
                open=worker_pb2.WorkOpen(queues=["stuck"], worker_id="sleeper"), credits=1000
            )
        )
        # Never read: within the deadline (and a store round trip) the node closes the
        # stream and what it could not write is READY again, at the attempt it had.
        deadline = time.monotonic() + 15
        while True:
            now = await states(node, "stuck")
            running = {i for i, (s, _a) in now.items() if s is TaskState.RUNNING}
            ready = {i for i, (s, a) in now.items() if s is TaskState.READY and a == 0}
            if ready and running | ready == ids:
                await asyncio.sleep(1.5)  # still so a moment later: the stream is gone
                if await states(node, "stuck") == now:
                    break
            assert time.monotonic() < deadline, "the stream was not closed at its deadline"
            await asyncio.sleep(0.2)
        assert len(ready) > len(running)  # the node held little of it
        # Reading now, the worker gets what was written before the stall, then the status.
        delivered: set[str] = set()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async with asyncio.timeout(10):
                while (message := await call.read()) is not grpc.aio.EOF:
                    delivered |= {t.id for t in message.tasks}
        assert ended.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "read nothing of this stream for 1 s" in (ended.value.details() or "")
        # Still leased: what reached the worker. The message that was being written when the
        # deadline passed came later: its tasks had been given back (their leases are stale).
        assert running <= delivered and len(delivered - running) < 20
    # An honest worker then gets the given-back tasks at their first attempt.
    assert node.store is not None
    again: list[Any] = []
    while claimed := await node.store.claim("default", ["stuck"], "next", 1000, node.clock.now()):
        again += claimed  # a claim's bytes are bounded: a few at a time
    assert {t.id for t in again} == ready and {t.attempt - t.retry_base for t in again} == {1}


async def test_a_stalled_stream_ends_at_once_and_keeps_its_slot_until_the_transport_lets_go(
    client: Client, node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work_stream, "STREAM_WRITE_DEADLINE", 1.0)
    sessions: list[work_stream.WorkSession] = []
    ended = asyncio.Event()
    serve = work_stream.WorkSession.run

    async def run(session: work_stream.WorkSession, *args: Any) -> None:
        sessions.append(session)
        try:
            await serve(session, *args)
        finally:
            ended.set()

    monkeypatch.setattr(work_stream.WorkSession, "run", run)
    await submit_big(client, "stall", 60)
    async with plain_channel(node) as channel:
        call = worker_pb2_grpc.WorkerServiceStub(channel).Work()  # type: ignore[no-untyped-call]
        await call.write(
            worker_pb2.WorkRequest(
                open=worker_pb2.WorkOpen(queues=["stall"], worker_id="sleeper"), credits=1000
            )
        )
        # The worker never reads: the session ends after its write deadline, without waiting
        # for the write that stalled (bounded here by far more than the deadline).
        async with asyncio.timeout(20):
            await ended.wait()
        (session,) = sessions
        slots = session._claims.slots
        assert slots.open("default") == 1  # the stalled message is still in the transport
        with pytest.raises(grpc.aio.AioRpcError) as stalled:
            async with asyncio.timeout(10):
                while await call.read() is not grpc.aio.EOF:
                    pass
        assert stalled.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        deadline = time.monotonic() + 10
        while slots.open("default"):  # the worker read it all: the slot is given back
            assert time.monotonic() < deadline, "the stalled stream kept its slot"
            await asyncio.sleep(0.05)


async def silent_streams(
    channel: Any, n: int, metadata: tuple[tuple[str, str], ...] | None = None
) -> list[Any]:
    """``n`` Work calls that start and never send a message."""
    stub = worker_pb2_grpc.WorkerServiceStub(channel)  # type: ignore[no-untyped-call]
    calls = [stub.Work(metadata=metadata) for _ in range(n)]
    for call in calls:
        await call.wait_for_connection()
    return calls


async def opens_and_works(node: Node, token: str | None = None) -> None:
    async with Client(node.address, timeout=10, token=token) as c:
        await c.submit("honest")
        async with plain_channel(node) as channel:
            call = worker_pb2_grpc.WorkerServiceStub(channel).Work(  # type: ignore[no-untyped-call]
                metadata=(("authorization", f"Bearer {token}"),) if token else None
            )
            await call.write(
                worker_pb2.WorkRequest(open=worker_pb2.WorkOpen(queues=["honest"]), credits=1)
            )
            async with asyncio.timeout(10):
                message = await call.read()
            assert len(message.tasks) == 1
            call.cancel()


async def test_streams_that_never_open_are_closed_and_capped(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Openings, "deadline", 1.0)
    monkeypatch.setattr(Openings, "cap", 4)
    async with plain_channel(node) as channel:
        silent = await silent_streams(channel, 4)
        await asyncio.sleep(0.3)
        (over,) = await silent_streams(channel, 1)
        assert await over.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "not sent their open message" in (await over.details() or "")
        started = time.monotonic()
        for call in silent:
            assert await call.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "open message within 1 s" in (await call.details() or "")
        assert time.monotonic() - started < 5
    await opens_and_works(node)


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens]\n"{TEAM_A}" = ["team-a"]\n"{TEAM_B}" = ["default"]\n')
    path.chmod(0o600)
    return path


async def test_with_tokens_a_stream_is_checked_at_once_and_capped_per_token(
    make_node: NodeFactory, clock: ManualClock, tokens: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Openings, "deadline", 2.0)
    monkeypatch.setattr(Openings, "per_key", 3)
    node = await make_node(clock=clock, auth_tokens=str(tokens))
    async with plain_channel(node) as channel:
        # Without a token a stream is refused before it sends anything.
        (anonymous,) = await silent_streams(channel, 1)
        async with asyncio.timeout(1):
            assert await anonymous.code() is grpc.StatusCode.UNAUTHENTICATED
        # One tenant's silent streams fill its own share only.
        team_a = (("authorization", f"Bearer {TEAM_A}"),)
        await silent_streams(channel, 3, team_a)
        await asyncio.sleep(0.3)
        (over,) = await silent_streams(channel, 1, team_a)
        assert await over.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        await opens_and_works(node, TEAM_B)  # another tenant's worker opens meanwhile


async def test_a_batch_whose_full_answer_cannot_be_read_is_refused_before_it_is_written(
    client: Client, node: Node
) -> None:
    # With their idempotency keys echoed, 10,000 tasks answer with ~4.4 MB: past 4 MiB.
    specs = [
        tasks_pb2.TaskSpec(queue="bulk", delay={"seconds": 60}, idempotency_key=f"{i:0300d}")
        for i in range(10_000)
    ]
    async with plain_channel(node) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SubmitBatch(tasks_pb2.SubmitBatchRequest(tasks=specs))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        details = refused.value.details() or ""
        assert details.startswith("tasks: a full answer to these 10000 tasks")
        assert f"the limit is {MAX_ANSWER_BYTES} bytes" in details and "ids_only" in details
        assert (await client.list(queue="bulk")).tasks == []  # nothing was written
        # ids_only answers in a few bytes a task: accepted, and readable.
        answer = await stub.SubmitBatch(tasks_pb2.SubmitBatchRequest(tasks=specs, ids_only=True))
        assert len(answer.ids) == 10_000 and all(answer.created)


async def test_the_sdk_splits_a_batch_whose_answer_would_not_fit(
    client: Client, node: Node
) -> None:
    keyed = [
        NewTask(queue="sdk", delay=timedelta(seconds=60), idempotency_key=f"{i:0300d}")
        for i in range(10_000)
    ]
    small = await client.submit_many(keyed)  # one request could not carry its answer
    assert len({s.task.id for s in small}) == 10_000 and all(s.created for s in small)
    assert [s.task.idempotency_key for s in small] == [t.idempotency_key for t in keyed]
    large = await client.submit_many([NewTask(queue="sdk2", payload=b"y" * BIG) for _ in range(30)])
    assert [s.task.payload for s in large] == [b"y" * BIG] * 30
    assert len(await states(node, "sdk")) == 10_000


async def test_a_hand_off_leases_a_stream_no_more_than_its_byte_budget(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    specs = [TaskSpec(queue="h", run_at=now, payload=b"z" * BIG) for _ in range(12)]
    subs = await store.submit(specs, now - timedelta(seconds=5))
    ids = [s.task.id for s in subs]
    owner = LocalOwnership(store, "n")
    await owner.start()
    # Two streams of one worker id: 8 tasks offered to the first (1 MiB), 4 to the second
    # (its budget passed already: one task still goes, as a claim takes one).
    leases = dict.fromkeys(ids, "w")
    budgets = {i: (0, 1024 * 1024) for i in ids[:8]} | {i: (1, 1) for i in ids[8:]}
    result = await store.fire_listed(owner.owned(), now, ids, leases=leases, budgets=budgets)
    leased = [t.id for t in result.leased]
    assert leased[:3] == ids[:3] and len(leased) == 4  # 3 x 256 KiB fit in 1 MiB, a 4th not
    assert ids[8] in leased
    rest = [await store.get(i, "default") for i in ids if i not in leased]
    assert {(t.state, t.attempt) for t in rest} == {(TaskState.READY, 0)}  # fired, not leased
