"""Every kind of bad input gets the right gRPC status and a message that names the problem,
and never changes what was accepted before."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import grpc
import pytest

from chronoq.api.v1 import (
    schedules_pb2,
    schedules_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
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
    from chronoq.limits import Limits

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


# ---------------------------------------------------------------- every field bounded


@pytest.fixture
async def schedule_stub(node: Node):  # type: ignore[no-untyped-def]
    channel = grpc.aio.insecure_channel(node.address)
    try:
        yield schedules_pb2_grpc.ScheduleServiceStub(channel)
    finally:
        await channel.close()


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: spec(idempotency_key="k\x00"), "idempotency_key: must not contain NUL"),
        (lambda: spec(idempotency_key="k" * 513), "idempotency_key: is 513 characters long"),
        (lambda: spec(queue="q\n"), "queue: 'q\\n' has characters outside"),
        (lambda: spec(namespace="ns\n"), "namespace: 'ns\\n' has characters outside"),
        (lambda: spec(misfire_policy=7), "misfire_policy: unknown value 7"),
        (lambda: spec(misfire_grace={"seconds": 10**10}), "misfire_grace: is 115740 days"),
        (lambda: spec(retry={"backoff_max": {"seconds": 10**10}}), "retry.backoff_max: is"),
        (lambda: spec(lease_timeout={"seconds": 10**10}), "lease_timeout: must be between"),
        (lambda: spec(delay={"seconds": 315_576_000_000}), "delay: is"),
        (lambda: spec(run_at={"seconds": 253_402_300_000}), "run_at: 9999-"),
        (lambda: spec(run_at={"seconds": -62_135_596_800}), "run_at: 0001-01-01"),
    ],
)
async def test_bad_task_fields(stubs, make, words) -> None:  # type: ignore[no-untyped-def]
    tasks, _ = stubs
    code, details = await status_of(tasks.Submit(tasks_pb2.SubmitRequest(task=make())))
    assert code == INVALID and words in details, details


async def test_refusals_echo_little_of_the_input(stubs) -> None:  # type: ignore[no-untyped-def]
    tasks, _ = stubs
    huge = "x" * 100_000 + "!"
    code, details = await status_of(tasks.Submit(tasks_pb2.SubmitRequest(task=spec(queue=huge))))
    assert code == INVALID and details.startswith("queue: is 100001 characters long")
    code, details = await status_of(tasks.GetTask(tasks_pb2.GetTaskRequest(id="y" * 100_000)))
    assert code == INVALID and details.startswith("id: ") and len(details) < 200
    code, details = await status_of(
        tasks.Submit(tasks_pb2.SubmitRequest(task=spec(queue="!" * 100)))
    )
    assert code == INVALID and len(details) < 200 and "\u2026" in details


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"cron": "0 0 31 2 *"}, "cron: '0 0 31 2 *' has no next occurrence"),
        ({"cron": "* * * *"}, "cron: '* * * *' is not a 5-field cron expression"),
        ({"cron": "* * * * *", "timezone": "America"}, "timezone: 'America' is not an IANA"),
        ({"cron": "* * * * *", "timezone": "../etc"}, "timezone: '../etc' is not an IANA"),
        ({"cron": "* * * * *", "timezone": "UTC\x00"}, "timezone:"),
        ({"interval": {"seconds": 10**10}}, "interval: is 115740 days"),
        ({"interval": {"nanos": 1000}}, "interval: must be at least 1 s"),
        (
            {"interval": {"seconds": 60}, "start_at": {"seconds": 253_402_300_000}},
            "start_at: 9999-",
        ),
        ({"cron": "* * * * *", "lease_timeout": {"seconds": 10**10}}, "lease_timeout:"),
        ({"cron": "* * * * *", "lease_timeout": {"seconds": 0, "nanos": 1}}, "lease_timeout:"),
        ({"cron": "* * * * *", "catch_up": 9}, "catch_up: unknown value 9"),
        ({"cron": "* * * * *", "name": "s\n"}, "name: 's\\n' has characters outside"),
        ({"cron": "* * * * *", "retry": {"max_attempts": 5000}}, "max_attempts: must be"),
    ],
)
async def test_bad_schedule_fields(schedule_stub, fields, words) -> None:  # type: ignore[no-untyped-def]
    fields.setdefault("name", "s")
    pb = schedules_pb2.ScheduleSpec(queue="q", **fields)
    code, details = await status_of(schedule_stub.CreateSchedule(pb))
    assert code == INVALID and words in details, details


async def test_schedule_names_are_checked_on_every_call(schedule_stub) -> None:  # type: ignore[no-untyped-def]
    ref = schedules_pb2.ScheduleRef(name="s\x00")
    for call in (
        schedule_stub.GetSchedule,
        schedule_stub.PauseSchedule,
        schedule_stub.ResumeSchedule,
        schedule_stub.DeleteSchedule,
    ):
        code, details = await status_of(call(ref))
        assert code == INVALID and details.startswith("name:"), details
    listing = schedules_pb2.ListSchedulesRequest(page_token="a\x00", page_size=10)
    code, details = await status_of(schedule_stub.ListSchedules(listing))
    assert code == INVALID and "page_token: must not contain NUL" in details
    for garbage in ("not a name!", "../x", "x" * 200):
        listing = schedules_pb2.ListSchedulesRequest(page_token=garbage)
        code, details = await status_of(schedule_stub.ListSchedules(listing))
        assert code == INVALID and details.startswith("page_token: is not a token"), details
    code, details = await status_of(
        schedule_stub.ListSchedules(schedules_pb2.ListSchedulesRequest(page_size=5000))
    )
    assert code == INVALID and "page_size" in details


@pytest.mark.parametrize("rate", [math.nan, math.inf, -1.0, 1e300])
async def test_queue_limits_must_be_finite(stubs, rate: float) -> None:  # type: ignore[no-untyped-def]
    tasks, _ = stubs
    for limit in (
        tasks_pb2.QueueLimit(queue="q", rate=rate),
        tasks_pb2.QueueLimit(queue="q", rate=1, burst=rate),
    ):
        code, details = await status_of(tasks.SetQueueLimit(limit))
        assert code == INVALID and details.startswith(("rate:", "burst:")), details
    listed = await tasks.ListQueueLimits(tasks_pb2.ListQueueLimitsRequest())
    assert not listed.limits


async def test_worker_strings_refuse_nul_and_a_failure_message_is_cleaned(
    stubs, client: Client
) -> None:  # type: ignore[no-untyped-def]
    _, workers = stubs
    code, details = await status_of(
        workers.Claim(worker_pb2.ClaimRequest(queues=["w"], worker_id="w\x00"))
    )
    assert code == INVALID and "worker_id: must not contain NUL" in details
    sub = await client.submit("w", max_attempts=1)
    (task,) = await client.claim(["w"])
    lease = worker_pb2.Lease(task_id=task.id, lease_token=task.attempt)
    error = "crashed\x00here" + "!" * 10_000
    failed = await workers.Fail(worker_pb2.FailRequest(lease=lease, error=error))
    assert failed.state == tasks_pb2.TASK_STATE_DEAD  # recorded, not left RUNNING
    assert failed.last_error.startswith("crashed\ufffdhere") and len(failed.last_error) == 4000
    assert (await client.get(sub.task.id)).state is TaskState.DEAD


async def test_out_of_range_lease_tokens_and_retry_after(stubs, client: Client) -> None:  # type: ignore[no-untyped-def]
    _, workers = stubs
    sub = await client.submit("w")
    await client.claim(["w"])
    big = worker_pb2.Lease(task_id=sub.task.id, lease_token=2**32 - 1)
    code, details = await status_of(workers.Complete(worker_pb2.CompleteRequest(lease=big)))
    assert code == INVALID and "lease.lease_token" in details
    lease = worker_pb2.Lease(task_id=sub.task.id, lease_token=1)
    fail = worker_pb2.FailRequest(lease=lease, error="x")
    fail.retry_after.FromSeconds(10**10)
    code, details = await status_of(workers.Fail(fail))
    assert code == INVALID and details.startswith("retry_after: is"), details
    assert (await client.get(sub.task.id)).state is TaskState.RUNNING  # nothing changed


@pytest.mark.parametrize(
    ("call", "make"),
    [
        (
            "Heartbeat",
            lambda: worker_pb2.HeartbeatRequest(leases=[worker_pb2.Lease(task_id="t")] * 1001),
        ),
        (
            "CompleteBatch",
            lambda: worker_pb2.CompleteBatchRequest(leases=[worker_pb2.Lease(task_id="t")] * 1001),
        ),
        ("Claim", lambda: worker_pb2.ClaimRequest(queues=["q"] * 101)),
        ("Requeue", lambda: tasks_pb2.RequeueRequest(ids=["t"] * 1001)),
        ("ListTasks", lambda: tasks_pb2.ListTasksRequest(page_size=1001)),
    ],
)
async def test_repeated_fields_are_capped(stubs, call: str, make) -> None:  # type: ignore[no-untyped-def]
    tasks, workers = stubs
    stub = getattr(tasks, call, None) or getattr(workers, call)
    code, details = await status_of(stub(make()))
    assert code == INVALID, details
    assert details.startswith(("leases: holds", "queues: holds", "ids: holds", "page_size:"))


async def test_a_huge_heartbeat_is_refused_before_any_work(stubs) -> None:  # type: ignore[no-untyped-def]
    """200,000 leases (the issue's million does not fit the node's message cap): refused on
    its length, before one lease is converted or the store is asked."""
    _, workers = stubs
    leases = [worker_pb2.Lease(task_id=f"{i:036d}", lease_token=1) for i in range(200_000)]
    started = time.perf_counter()
    code, details = await status_of(workers.Heartbeat(worker_pb2.HeartbeatRequest(leases=leases)))
    print(f"200k-lease heartbeat refused in {time.perf_counter() - started:.3f} s")
    assert code == INVALID and "leases: holds 200000 entries; the limit is 1000" in details


@pytest.mark.parametrize(
    "body", [b"\xff\xff\xff", b"\n\x02\xff\xfe", b"garbage that is not a message"]
)
async def test_malformed_messages_are_invalid_argument(node: Node, body: bytes) -> None:
    async with grpc.aio.insecure_channel(node.address) as channel:
        for method in ("/chronoq.v1.TaskService/Submit", "/chronoq.v1.WorkerService/Claim"):
            code, details = await status_of(channel.unary_unary(method)(body, timeout=10))
            assert code == INVALID and details.startswith("request: is not a valid message")
