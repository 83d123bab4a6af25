"""A batch larger than one insert statement: several statements in one transaction, with
the answers of a single one (order, ids, repeated keys across statements)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from chronoq.clock import ManualClock
from chronoq.models import Task, TaskSpec, TaskState
from chronoq.store import Store
from chronoq.store.task_inserts import INSERT_CHUNK

pytestmark = pytest.mark.timeout(60)


async def test_a_batch_over_several_statements_answers_like_one(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    count = 2 * INSERT_CHUNK + 5
    specs = [
        TaskSpec(queue="chunks", run_at=now + timedelta(minutes=5), idempotency_key=f"k{i}")
        for i in range(count)
    ]
    # The last spec repeats the first one's key: it lands in another statement.
    specs.append(TaskSpec(queue="chunks", run_at=now, idempotency_key="k0"))
    accepted = await store.submit_ids(specs, now)
    assert [c for _i, c in accepted] == [True] * count + [False]
    assert accepted[-1][0] == accepted[0][0]
    assert len({i for i, _c in accepted}) == count

    again = await store.submit(specs[:3] + specs[-3:], now)  # all repeats now
    assert [o.created for o in again] == [False] * 6
    assert [o.task.id for o in again] == [accepted[i][0] for i in (0, 1, 2, -3, -2, -1)]



async def test_values_a_batch_shares_are_sent_once_and_each_row_keeps_its_own(
    store: Store, clock: ManualClock
) -> None:
    """A column whose rows all hold one value is sent as that value alone and spread over
    every row by the statement; a column that varies, nulls included, stays row by row, over
    one statement and over several."""
    now = clock.now()
    later = now + timedelta(minutes=5)
    for count in (3, 2 * INSERT_CHUNK + 3):
        queue = f"shared-{count}"
        varied = [
            TaskSpec(
                queue=queue,
                run_at=later,
                priority=i % 3,
                payload=b"%d" % i,
                idempotency_key=None if i % 2 else f"{queue}-{i}",
                content_type="application/json" if i == 1 else "application/octet-stream",
                trace_context=(("traceparent", f"00-{i}"),) if i == 2 else (),
                max_attempts=5,
            )
            for i in range(count)
        ]
        ids = await store.submit_ids(varied, now)
        got = {t.id: t for t in await tasks_of(store, queue)}
        assert len(got) == count
        for (task_id, created), spec in zip(ids, varied, strict=True):
            task = got[task_id]
            assert created
            assert (task.priority, task.payload, task.idempotency_key) == (
                spec.priority, spec.payload, spec.idempotency_key
            )
            assert (task.content_type, task.trace_context) == (
                spec.content_type, spec.trace_context
            )
            assert (task.max_attempts, task.run_at, task.state) == (5, later, TaskState.SCHEDULED)
        # All alike but the id: every column but the ids sent once, nulls included.
        alike = [TaskSpec(queue=queue + "-alike", run_at=now) for _ in range(count)]
        ids = await store.submit_ids(alike, now)
        got = {t.id: t for t in await tasks_of(store, queue + "-alike")}
        assert set(got) == {i for i, _c in ids} and len(got) == count
        assert {(t.state, t.idempotency_key, t.payload, t.trace_context) for t in got.values()} == {
            (TaskState.READY, None, b"", ())
        }


async def tasks_of(store: Store, queue: str) -> list[Task]:
    out: list[Task] = []
    token = ""
    while True:
        page = await store.list_tasks("default", queue=queue, page_token=token, page_size=500)
        out += page.tasks
        token = page.next_token
        if not token:
            return out
