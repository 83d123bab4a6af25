"""Contract: submit (one, a batch, all or nothing) and idempotency, through the port only."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from chronoq.errors import StoreUnavailable, TaskNotFound
from chronoq.models import TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)


async def every_task(store: TaskStore, namespace: str) -> list[str]:
    """Ids of every task of ``namespace``, through the listing's pages."""
    ids: list[str] = []
    token = ""
    for _ in range(1000):  # bounded: a contract's namespace holds far fewer pages
        page = await store.list_tasks(namespace, page_size=100, page_token=token)
        ids += [t.id for t in page.tasks]
        if not (token := page.next_token):
            return ids
    raise AssertionError("the listing never ended")


async def test_one_submit_is_stored_as_asked(store_shape: TaskStore, now: datetime) -> None:
    later = now + timedelta(minutes=5)
    (out,) = await store_shape.submit(
        [TaskSpec(queue="mail", run_at=later, namespace="a", payload=b"hi", priority=3)], now
    )
    assert out.created
    task = out.task
    assert (task.namespace, task.queue, task.payload, task.priority) == ("a", "mail", b"hi", 3)
    assert task.state is TaskState.SCHEDULED and task.attempt == 0 and task.run_at == later
    assert 0 <= task.partition < PARTITIONS
    assert await store_shape.get(task.id, "a") == task
    with pytest.raises(TaskNotFound):
        await store_shape.get(task.id, "b")  # a task is seen only in its namespace


async def test_a_due_task_starts_ready_a_later_one_scheduled(
    store_shape: TaskStore, now: datetime
) -> None:
    due, later = await store_shape.submit(
        [TaskSpec(queue="q", run_at=now), TaskSpec(queue="q", run_at=now + timedelta(seconds=1))],
        now,
    )
    assert due.task.state is TaskState.READY
    assert later.task.state is TaskState.SCHEDULED


async def test_a_batch_answers_in_order_and_spreads_over_partitions(
    store_shape: TaskStore, now: datetime
) -> None:
    specs = [
        TaskSpec(queue="q", run_at=now + timedelta(seconds=i), payload=str(i).encode())
        for i in range(200)
    ]
    out = await store_shape.submit(specs, now)
    assert [o.task.payload for o in out] == [s.payload for s in specs]
    assert all(o.created for o in out)
    assert len({o.task.id for o in out}) == 200
    # 200 tasks over 8 partitions: every partition holds some (so sharding sees them all).
    assert {o.task.partition for o in out} == set(range(PARTITIONS))
    assert sorted(await every_task(store_shape, "default")) == sorted(o.task.id for o in out)
    assert await store_shape.submit([], now) == []


async def test_a_refused_batch_inserts_nothing(store_shape: TaskStore, now: datetime) -> None:
    """One spec the store cannot keep (a NUL in a text) refuses the whole batch.

    The port does not name the error yet (today the driver's own data error comes out; the
    edge refuses such text before the store): the contract is that it is a refusal, not an
    outage, and that nothing of the batch was kept."""
    specs = [TaskSpec(queue="q", run_at=now, idempotency_key=f"k{i}") for i in range(50)]
    specs.append(TaskSpec(queue="bad\x00queue", run_at=now))
    with pytest.raises(Exception) as refused:  # the port names no error yet (docstring)
        await store_shape.submit(specs, now)
    assert not isinstance(refused.value, StoreUnavailable)
    assert await every_task(store_shape, "default") == []
    # The keys of the refused batch are free: a later submit creates them.
    out = await store_shape.submit(specs[:50], now)
    assert all(o.created for o in out)


async def test_a_repeated_key_returns_the_first_task(store_shape: TaskStore, now: datetime) -> None:
    (first,) = await store_shape.submit(
        [TaskSpec(queue="q", run_at=now, idempotency_key="k", payload=b"first")], now
    )
    assert first.created
    again = await store_shape.submit(
        [
            TaskSpec(queue="other", run_at=now + timedelta(hours=1), idempotency_key="k"),
            TaskSpec(queue="q", run_at=now, idempotency_key="fresh"),
            TaskSpec(queue="q", run_at=now, idempotency_key="fresh"),  # earlier in this batch
        ],
        now + timedelta(seconds=1),
    )
    assert [o.created for o in again] == [False, True, False]
    assert again[0].task == first.task  # the first task as it was: nothing of the second kept
    assert again[2].task == again[1].task
    ids = await store_shape.submit_ids([TaskSpec(queue="q", run_at=now, idempotency_key="k")], now)
    assert ids == [(first.task.id, False)]
    assert len(await every_task(store_shape, "default")) == 2


async def test_keys_of_different_namespaces_are_independent(
    store_shape: TaskStore, now: datetime
) -> None:
    out = await store_shape.submit(
        [
            TaskSpec(queue="q", run_at=now, namespace="a", idempotency_key="k"),
            TaskSpec(queue="q", run_at=now, namespace="b", idempotency_key="k"),
        ],
        now,
    )
    assert [o.created for o in out] == [True, True]
    assert out[0].task.id != out[1].task.id
    (a,) = await store_shape.submit(
        [TaskSpec(queue="q", run_at=now, namespace="a", idempotency_key="k")], now
    )
    assert not a.created and a.task.id == out[0].task.id
    assert await every_task(store_shape, "a") == [out[0].task.id]
    assert await every_task(store_shape, "b") == [out[1].task.id]


async def test_submit_ids_creates_like_submit(store_shape: TaskStore, now: datetime) -> None:
    specs = [TaskSpec(queue="q", run_at=now, idempotency_key=f"k{i % 3}") for i in range(6)]
    ids = await store_shape.submit_ids(specs, now)
    assert [created for _id, created in ids] == [True, True, True, False, False, False]
    assert [i for i, _c in ids[3:]] == [i for i, _c in ids[:3]]
    for task_id, _created in ids:
        assert (await store_shape.get(task_id, "default")).state is TaskState.READY
