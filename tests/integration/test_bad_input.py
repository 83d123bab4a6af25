"""Every kind of bad input gets the right gRPC status and a message that names the problem,
and never changes what was accepted before."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc, worker_pb2, worker_pb2_grpc
from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.models import Lease, TaskState
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
async def stubs(node: Node):  # type: ignore[no-untyped-def]
    channel = grpc.aio.insecure_channel(node.address)
    try:
        yield tasks_pb2_grpc.TaskServiceStub(channel), worker_pb2_grpc.WorkerServiceStub(channel)
    finally:
        await channel.close()


async def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    raise AssertionError("the request was accepted")


def spec(**fields: object) -> tasks_pb2.TaskSpec:
    fields.setdefault("queue", "q")
    pb = tasks_pb2.TaskSpec(**fields)  # type: ignore[arg-type]
    if "run_at" not in fields and "delay" not in fields:
        pb.delay.FromTimedelta(timedelta(seconds=5))
    return pb


@pytest.mark.parametrize(
    ("make", "code", "words"),
    [
        (lambda: tasks_pb2.TaskSpec(queue="q"), INVALID, "run_at: is required"),
        (
            lambda: spec(run_at={"seconds": 1_900_000_000, "nanos": 2_000_000_000}),
            INVALID,
            "run_at: is not a valid timestamp",
        ),
        (lambda: spec(run_at={"seconds": 10**11}), INVALID, "run_at"),
        (
            lambda: spec(run_at={"seconds": 1_900_000_000 + 400 * 86400}),
            INVALID,
            "beyond the scheduling horizon",
        ),
        (lambda: spec(queue=""), INVALID, "queue: must not be empty"),
        (lambda: spec(queue="q" * 129), INVALID, "queue: is 129 characters long; the limit is 128"),
        (lambda: spec(queue="bad queue!"), INVALID, "queue: 'bad queue!' has characters outside"),
        (
            lambda: spec(payload=b"x" * (256 * 1024 + 1)),
            INVALID,
            "payload: is 262145 bytes; the limit is 262144",
        ),
        (
            lambda: spec(retry={"max_attempts": 0}),
            INVALID,
            "max_attempts: must be between 1 and 1000, got 0",
        ),
        (lambda: spec(lease_timeout={"seconds": 0}), INVALID, "lease_timeout: must be between"),
        (lambda: spec(delay={"seconds": -5}), INVALID, "delay: must not be negative"),
        (lambda: spec(namespace="a/b"), INVALID, "namespace:"),
    ],
)
async def test_bad_submit(stubs, clock: ManualClock, make, code, words) -> None:  # type: ignore[no-untyped-def]
    clock.set(clock.now().replace(year=2030))  # run_at 1_900_000_000 is in 2030
    tasks, _ = stubs
    got_code, details = await status_of(tasks.Submit(tasks_pb2.SubmitRequest(task=make())))
    assert got_code == code
    assert words in details


async def test_rejected_batch_inserts_nothing(stubs, store: Store) -> None:  # type: ignore[no-untyped-def]
    tasks, _ = stubs
    good = spec()
    bad = spec(queue="")
    code, details = await status_of(
        tasks.SubmitBatch(tasks_pb2.SubmitBatchRequest(tasks=[good, bad]))
    )
    assert code == INVALID and "tasks[1].queue: must not be empty" in details
    code, details = await status_of(tasks.SubmitBatch(tasks_pb2.SubmitBatchRequest()))
    assert code == INVALID and "at least one task" in details
    assert await store.count_by_state() == {}


async def test_payload_limit_is_configurable(make_node: NodeFactory) -> None:
    from chronoq.models import Limits

    node = await make_node(limits=Limits(max_payload_bytes=1024))
    client = Client(node.address)
    try:
        with pytest.raises(Exception, match="payload: is 1025 bytes; the limit is 1024 bytes"):
            await client.submit("q", payload=b"x" * 1025)
        assert (await client.submit("q", payload=b"x" * 1024)).created
    finally:
        await client.close()


async def test_unknown_and_malformed_ids(stubs) -> None:  # type: ignore[no-untyped-def]
    tasks, workers = stubs
    missing = "00000000-0000-4000-8000-000000000000"
    code, details = await status_of(tasks.GetTask(tasks_pb2.GetTaskRequest(id=missing)))
    assert code == grpc.StatusCode.NOT_FOUND and f"no task '{missing}'" in details
    code, _ = await status_of(tasks.CancelTask(tasks_pb2.CancelTaskRequest(id=missing)))
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = await status_of(tasks.GetTask(tasks_pb2.GetTaskRequest(id="nope")))
    assert code == INVALID and "'nope' is not a task id" in details
    code, details = await status_of(tasks.GetTask(tasks_pb2.GetTaskRequest()))
    assert code == INVALID and "id: is required" in details
    lease = worker_pb2.Lease(task_id=missing, lease_token=1)
    code, _ = await status_of(workers.Complete(worker_pb2.CompleteRequest(lease=lease)))
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = await status_of(tasks.Requeue(tasks_pb2.RequeueRequest(ids=[missing])))
    assert code == INVALID and "nothing was requeued" in details


async def test_worker_call_refusals(stubs, client: Client) -> None:  # type: ignore[no-untyped-def]
    _, workers = stubs
    sub = await client.submit("w")
    await client.claim(["w"])
    stale = worker_pb2.Lease(task_id=sub.task.id, lease_token=7)
    code, details = await status_of(workers.Complete(worker_pb2.CompleteRequest(lease=stale)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "lease token 7 is stale" in details
    code, details = await status_of(workers.Fail(worker_pb2.FailRequest(lease=stale, error="x")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "current attempt is 1" in details
    code, details = await status_of(workers.Complete(worker_pb2.CompleteRequest()))
    assert code == INVALID and "lease: is required" in details
    zero = worker_pb2.Lease(task_id=sub.task.id, lease_token=0)
    code, details = await status_of(workers.Complete(worker_pb2.CompleteRequest(lease=zero)))
    assert code == INVALID and "lease_token" in details
    code, details = await status_of(workers.Claim(worker_pb2.ClaimRequest()))
    assert code == INVALID and "at least one queue" in details
    code, details = await status_of(
        workers.Claim(worker_pb2.ClaimRequest(queues=["w"], max_tasks=5000))
    )
    assert code == INVALID and "max_tasks" in details
    # None of it touched the running task.
    current = await client.get(sub.task.id)
    assert current.state is TaskState.RUNNING and current.attempt == 1
    assert (await client.complete(Lease(sub.task.id, 1))).state is TaskState.SUCCEEDED


async def test_accepted_tasks_survive_rejected_requests(
    stubs, client: Client, store: Store
) -> None:  # type: ignore[no-untyped-def]
    tasks, _ = stubs
    kept = await client.submit_many(
        [NewTask(queue="keep", idempotency_key=f"k{i}") for i in range(5)]
    )
    before = {t.task.id: t.task for t in kept}
    for bad in (spec(queue=""), spec(payload=b"x" * 300_000), spec(idempotency_key="k1", queue="")):
        await status_of(tasks.Submit(tasks_pb2.SubmitRequest(task=bad)))
    batch = [spec(idempotency_key="k2"), spec(queue="q" * 200)]
    await status_of(tasks.SubmitBatch(tasks_pb2.SubmitBatchRequest(tasks=batch)))
    after = {t.id: t async for t in client.iter_tasks()}
    assert after == before
    assert await store.count_by_state() == {TaskState.READY: 5}
