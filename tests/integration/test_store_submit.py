"""The store's submit: one insert that answers with its rows; repeated keys answer the first."""

from __future__ import annotations

from datetime import timedelta

import pytest

from chronoq.clock import ManualClock
from chronoq.models import Lease, LeaseMiss, TaskSpec, TaskState
from chronoq.store import Store

pytestmark = pytest.mark.timeout(60)


async def test_submit_answers_new_rows_and_the_first_task_of_a_repeated_key(
    store: Store, clock: ManualClock
) -> None:
    now = clock.now()
    (first,) = await store.submit([TaskSpec(queue="q", run_at=now, idempotency_key="k1")], now)
    assert first.created
    specs = [
        TaskSpec(queue="q", run_at=now, payload=b"due"),
        TaskSpec(queue="q", run_at=now + timedelta(hours=1), idempotency_key="k2"),
        TaskSpec(queue="q", run_at=now, idempotency_key="k1"),  # submitted before
        TaskSpec(queue="q", run_at=now, idempotency_key="k2"),  # earlier in this batch
        TaskSpec(
            queue="q", run_at=now, namespace="other", idempotency_key="k1"
        ),  # keys are per namespace
    ]
    out = await store.submit(specs, now)
    assert [o.created for o in out] == [True, True, False, False, True]
    assert out[2].task == first.task
    assert out[3].task == out[1].task
    assert out[0].task.state is TaskState.READY and out[0].task.payload == b"due"
    assert out[1].task.state is TaskState.SCHEDULED
    assert out[4].task.namespace == "other"
    for o in out:
        assert o.task == await store.get(o.task.id, o.task.namespace)
    ids = await store.submit_ids(specs, now)
    assert [created for _id, created in ids] == [True, False, False, False, False]
    assert [i for i, _c in ids[1:]] == [o.task.id for o in out[1:]]
    assert await store.submit([], now) == []


async def test_acks_and_heartbeats_say_why_a_lease_missed(store: Store, clock: ManualClock) -> None:
    now = clock.now()
    await store.submit([TaskSpec(queue="q", run_at=now) for _ in range(3)], now)
    one, two, three = await store.claim("default", ["q"], "w", 3, now)
    await store.cancel(two.id, "default", now)
    missing = "00000000-0000-4000-8000-000000000000"
    leases = [
        Lease(three.id, three.attempt - 1),
        Lease(two.id, two.attempt),
        Lease(missing, 1),
        Lease(one.id, one.attempt),
    ]
    beats = await store.heartbeat("default", leases, now)
    assert [b.reason for b in beats] == [
        LeaseMiss.STALE,
        LeaseMiss.CANCELLED,
        LeaseMiss.NO_TASK,
        None,
    ]
    assert [b.cancelled for b in beats] == [False, True, False, False]
    acks = await store.complete("default", leases, now)
    assert [a.reason for a in acks] == [
        LeaseMiss.STALE,
        LeaseMiss.CANCELLED,
        LeaseMiss.NO_TASK,
        None,
    ]
    assert acks[2].error.startswith("no task")
    (again,) = await store.complete("default", [Lease(one.id, one.attempt)], now)
    assert again.ok  # the same ack again: answered ok
    (done,) = await store.heartbeat("default", [Lease(one.id, one.attempt)], now)
    assert done.reason is LeaseMiss.NOT_RUNNING
