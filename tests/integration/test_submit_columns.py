"""A bulk submit in the columnar form (real node, real store): the SDK sends tasks that differ
only in run_at, payload and key in columns, and they are stored as sent, in order, keyed, a
repeat creating nothing twice; a bad column value or shape is refused by name with nothing
stored; and a node that does not know the form gets whole specs."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from chronoq.api import spec_columns
from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc
from chronoq.client import Client, NewTask
from chronoq.client.columns import columnar
from chronoq.clock import ManualClock
from chronoq.models import Task
from chronoq.node import Node

pytestmark = pytest.mark.timeout(120)


async def stored(node: Node, queue: str) -> dict[str, Task]:
    assert node.store is not None
    out: dict[str, Task] = {}
    token = ""
    while True:
        page = await node.store.list_tasks("default", queue=queue, page_token=token, page_size=500)
        out |= {t.id: t for t in page.tasks}
        token = page.next_token
        if not token:
            return out


async def test_a_columnar_submit_stores_each_task_as_sent(
    node: Node, client: Client, clock: ManualClock
) -> None:
    start = clock.now() + timedelta(minutes=5)
    tasks = [
        NewTask(
            queue="cols",
            run_at=start + timedelta(milliseconds=i),
            payload=b"p%d" % i,
            idempotency_key=f"own{i}" if i % 3 == 0 else None,
            priority=2,
        )
        for i in range(300)
    ]
    assert columnar(tasks, "default") is not None  # the form this test is about
    first = await client.submit_ids(tasks)
    assert [c for _i, c in first] == [True] * len(tasks)
    rows = await stored(node, "cols")
    assert len(rows) == len(tasks)
    for (task_id, _c), task in zip(first, tasks, strict=True):
        row = rows[task_id]
        assert (row.run_at, row.payload, row.priority) == (task.run_at, task.payload, 2)
        assert row.idempotency_key == task.idempotency_key or (
            task.idempotency_key is None and row.idempotency_key  # minted by the SDK
        )
    again = await client.submit_ids([t for t in tasks if t.idempotency_key])
    assert again == [
        (i, False) for (i, _c), t in zip(first, tasks, strict=True) if t.idempotency_key
    ]
    assert len(await stored(node, "cols")) == len(tasks)


@pytest.fixture
async def stub(node: Node):  # type: ignore[no-untyped-def]
    channel = grpc.aio.insecure_channel(node.address)
    try:
        yield tasks_pb2_grpc.TaskServiceStub(channel)
    finally:
        await channel.close()


async def refusal(stub: tasks_pb2_grpc.TaskServiceStub, req: tasks_pb2.SubmitBatchRequest) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.SubmitBatch(req)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return refused.value.details() or ""


async def test_a_bad_column_is_refused_by_name_and_nothing_is_stored(
    node: Node, stub: tasks_pb2_grpc.TaskServiceStub, clock: ManualClock
) -> None:
    soon = int(clock.now().timestamp() * 1_000_000) + 60_000_000
    n = 50

    def request(**changes: object) -> tasks_pb2.SubmitBatchRequest:
        fields: dict[str, object] = {
            "ids_only": True,
            "shared": tasks_pb2.TaskSpec(queue="badcols"),
            "count": n,
            "run_at_us": [soon] * n,
            "payloads": [b"x"] * n,
            "idempotency_keys": [f"k{i}" for i in range(n)],
        }
        fields.update(changes)
        return tasks_pb2.SubmitBatchRequest(**fields)  # type: ignore[arg-type]

    late = [soon] * n
    late[17] = soon + 10 * 365 * 86_400 * 1_000_000
    assert (await refusal(stub, request(run_at_us=late))).startswith("tasks[17].run_at: ")
    keys = [f"k{i}" for i in range(n)]
    keys[3] = "nul\x00"
    assert "tasks[3].idempotency_key: must not contain NUL" in await refusal(
        stub, request(idempotency_keys=keys)
    )
    big = [b"x"] * n
    big[49] = b"x" * (node.settings.limits.max_payload_bytes + 1)
    assert "tasks[49].payload: is " in await refusal(stub, request(payloads=big))
    assert "payloads: holds 49 values for 50 tasks" in await refusal(
        stub, request(payloads=[b"x"] * 49)
    )
    assert "count: is " in await refusal(stub, request(count=node.settings.max_batch + 1))
    assert await stored(node, "badcols") == {}
    accepted = await stub.SubmitBatch(request())
    assert len(accepted.ids) == n and all(accepted.created)


async def test_a_node_without_the_form_gets_whole_specs(
    node: Node, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node older than the columnar form sees a batch without tasks and refuses it, having
    stored nothing: the SDK sends that batch, and the next ones, whole."""
    monkeypatch.setattr(spec_columns, "is_columnar", lambda request: False)
    tasks = [NewTask(queue="olds", delay=timedelta(minutes=5)) for _ in range(20)]
    first = await client.submit_ids(tasks)
    assert [c for _i, c in first] == [True] * 20
    second = await client.submit_ids(tasks[:5])
    assert [c for _i, c in second] == [True] * 5
    assert set(await stored(node, "olds")) == {i for i, _c in first + second}
