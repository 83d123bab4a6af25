"""Contract: calls that race decide one winner in the store (rows affected), never by luck
of timing: keyed submits, concurrent fires, an ack against the reaper, double requeues."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from chronoq.errors import InvalidArgument
from chronoq.models import Lease, MisfirePolicy, TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)


async def own_all(store: TaskStore, token: int = 1) -> dict[int, int]:
    owned = {}
    for p in range(PARTITIONS):
        assert await store.take_fence(p, token, "contract", "me") is not None
        owned[p] = token
    return owned


async def test_concurrent_submits_of_one_key_make_one_task(
    store_shape: TaskStore, now: datetime
) -> None:
    spec = TaskSpec(queue="k", run_at=now, idempotency_key="once")
    answers = await asyncio.gather(*(store_shape.submit([spec], now) for _ in range(6)))
    outcomes = [a[0] for a in answers]
    assert sum(o.created for o in outcomes) == 1
    assert len({o.task.id for o in outcomes}) == 1
    page = await store_shape.list_tasks("default")
    assert [t.id for t in page.tasks] == [outcomes[0].task.id]


async def test_concurrent_fires_fire_each_task_once(store_shape: TaskStore, now: datetime) -> None:
    out = await store_shape.submit(
        [TaskSpec(queue="f", run_at=now + timedelta(seconds=1)) for _ in range(120)], now
    )
    owned = await own_all(store_shape)
    at = now + timedelta(seconds=2)
    results = await asyncio.gather(*(store_shape.fire_due(owned, at, batch=40) for _ in range(4)))
    fired = sum(r.fired for r in results)
    for _ in range(10):  # whatever the batches left, fired by later passes
        more = (await store_shape.fire_due(owned, at)).fired
        fired += more
        if not more:
            break
    assert fired == 120  # each once: a second fire of a task would count it again
    for o in out:
        assert (await store_shape.get(o.task.id, "default")).state is TaskState.READY


async def test_an_ack_racing_the_reaper_has_one_winner(
    store_shape: TaskStore, now: datetime
) -> None:
    lease = timedelta(seconds=2)
    await store_shape.submit(
        [TaskSpec(queue="r", run_at=now, lease_timeout=lease) for _ in range(20)], now
    )
    claimed = await store_shape.claim("default", ["r"], "w", 20, now)
    owned = await own_all(store_shape)
    at = now + lease + timedelta(seconds=1)  # every lease has expired

    acks, reaped = await asyncio.gather(
        store_shape.complete("default", [Lease(t.id, t.attempt) for t in claimed], at),
        store_shape.reap_expired(owned, at),
    )

    won_by_ack = {a.task_id for a in acks if a.ok}
    won_by_reaper = {t.id for t in reaped}
    assert not won_by_ack & won_by_reaper  # never both
    assert won_by_ack | won_by_reaper == {t.id for t in claimed}  # always one
    for t in claimed:
        state = (await store_shape.get(t.id, "default")).state
        assert state is (TaskState.SUCCEEDED if t.id in won_by_ack else TaskState.SCHEDULED)


async def test_two_requeues_of_one_dead_letter_have_one_winner(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.submit([TaskSpec(queue="d", run_at=now, max_attempts=1)], now)
    (task,) = await store_shape.claim("default", ["d"], "w", 1, now)
    await store_shape.fail("default", Lease(task.id, 1), "x", now)
    answers = await asyncio.gather(
        store_shape.requeue("default", [task.id], now),
        store_shape.requeue("default", [task.id], now),
        return_exceptions=True,
    )
    assert sum(isinstance(a, list) for a in answers) == 1
    assert sum(isinstance(a, InvalidArgument) for a in answers) == 1
    assert await store_shape.claim("default", ["d"], "w", 5, now) != []


async def test_a_late_owner_applies_each_tasks_misfire_policy(
    store_shape: TaskStore, now: datetime
) -> None:
    grace = timedelta(seconds=60)
    due = now + timedelta(seconds=30)
    late, skip, in_grace = (
        o.task
        for o in await store_shape.submit(
            [
                TaskSpec(queue="m", run_at=due),
                TaskSpec(
                    queue="m", run_at=due, misfire_policy=MisfirePolicy.SKIP, misfire_grace=grace
                ),
                TaskSpec(
                    queue="m",
                    run_at=due + timedelta(seconds=170),
                    misfire_policy=MisfirePolicy.SKIP,
                    misfire_grace=grace,
                ),
            ],
            now,
        )
    )
    owned = await own_all(store_shape)
    at = due + timedelta(seconds=210)  # 210 s late for two, 40 s late for the third
    result = await store_shape.fire_due(owned, at)
    assert (result.fired, result.skipped) == (2, 1)
    skipped = await store_shape.get(skip.id, "default")
    assert skipped.state is TaskState.SKIPPED and "misfire" in (skipped.last_error or "")
    assert (await store_shape.get(late.id, "default")).state is TaskState.READY
    assert (await store_shape.get(in_grace.id, "default")).state is TaskState.READY
