"""Contract: a paused queue's tasks fire but no claim or hand-off takes them until it
resumes; the resume applies the misfire policy; settings are bounded per namespace and read
alike from every shape (a store of shards holds them on every shard)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from chronoq.errors import NamespaceCapReached
from chronoq.models import MisfirePolicy, TaskSpec, TaskState
from chronoq.queue_settings import QueueSettings
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)


async def _own_all(store: TaskStore) -> dict[int, int]:
    owned = {}
    for p in range(PARTITIONS):
        assert await store.take_fence(p, 7, "contract", "me") is not None
        owned[p] = 7
    return owned


async def test_a_paused_queue_fires_but_is_not_claimed_until_it_resumes(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.submit(
        [TaskSpec(queue="p", run_at=now + timedelta(seconds=1)) for _ in range(12)]
        + [TaskSpec(queue="open", run_at=now + timedelta(seconds=1)) for _ in range(3)],
        now,
    )
    paused = await store_shape.pause_queue("default", "p", now, cap=10)
    assert paused.paused and paused.paused_at == now
    owned = await _own_all(store_shape)
    at = now + timedelta(seconds=5)
    fired = await store_shape.fire_due(owned, at)
    # Fired READY while paused, their lateness measured from run_at.
    assert fired.ready_by_queue[("default", "p")] == 12
    assert all(late == pytest.approx(4.0) for late in fired.lateness)
    # No claim takes them (even one naming an open queue beside it), nor counts them ready.
    assert await store_shape.claim("default", ["p"], "w", 10, at) == []
    both = await store_shape.claim("default", ["p", "open"], "w", 10, at)
    assert {t.queue for t in both} == {"open"} and len(both) == 3
    assert await store_shape.ready_counts([("default", "p")], [100]) == {}
    # Pausing again keeps the instant the pause began.
    again = await store_shape.pause_queue("default", "p", at, cap=10)
    assert again.paused_at == now

    resumed = await store_shape.resume_queue("default", "p", at)
    assert not resumed.settings.paused and resumed.skipped == 0 and resumed.ready == 12
    claimed = await store_shape.claim("default", ["p"], "w", 20, at)
    assert len(claimed) == 12 and all(t.state is TaskState.RUNNING for t in claimed)


async def test_a_resume_skips_what_the_misfire_policy_skips(
    store_shape: TaskStore, now: datetime
) -> None:
    grace = timedelta(seconds=30)
    skip = [
        TaskSpec(queue="m", run_at=now, misfire_policy=MisfirePolicy.SKIP, misfire_grace=grace)
        for _ in range(5)
    ]
    late = [TaskSpec(queue="m", run_at=now) for _ in range(4)]  # FIRE_LATE
    other = [  # another queue of the namespace: its SKIP tasks are not the resume's
        TaskSpec(queue="n", run_at=now, misfire_policy=MisfirePolicy.SKIP, misfire_grace=grace)
    ]
    fresh = [  # due later, within its grace at the resume
        TaskSpec(
            queue="m",
            run_at=now + timedelta(seconds=50),
            misfire_policy=MisfirePolicy.SKIP,
            misfire_grace=grace,
        )
    ]
    await store_shape.pause_queue("default", "m", now, cap=10)
    await store_shape.submit(skip + late + other, now)  # due at once: READY while paused
    await store_shape.submit(fresh, now)
    owned = await _own_all(store_shape)
    assert (await store_shape.fire_due(owned, now + timedelta(seconds=55))).fired == 1
    at = now + timedelta(seconds=60)  # the first ones waited past their grace

    resumed = await store_shape.resume_queue("default", "m", at)

    assert resumed.skipped == 5 and resumed.ready == 5
    claimed = await store_shape.claim("default", ["m", "n"], "w", 20, at)
    assert len(claimed) == 6  # the FIRE_LATE ones, the fresh one and the other queue's
    assert {t.misfire_policy for t in claimed if t.queue == "m"} == {
        MisfirePolicy.FIRE_LATE,
        MisfirePolicy.SKIP,
    }
    page = await store_shape.list_tasks("default", queue="m", state=TaskState.SKIPPED)
    assert len(page.tasks) == 5
    assert all("paused" in (t.last_error or "") for t in page.tasks)


async def test_a_resume_walks_a_backlog_larger_than_one_batch(
    store_shape: TaskStore, now: datetime
) -> None:
    grace = timedelta(seconds=1)
    await store_shape.pause_queue("default", "big", now, cap=10)
    specs = [
        TaskSpec(
            queue="big",
            run_at=now,
            misfire_policy=MisfirePolicy.SKIP if i % 2 else MisfirePolicy.FIRE_LATE,
            misfire_grace=grace,
        )
        for i in range(2500)  # more than RESUME_SKIP_BATCH READY tasks
    ]
    await store_shape.submit_ids(specs, now)
    resumed = await store_shape.resume_queue("default", "big", now + timedelta(seconds=10))
    assert resumed.skipped == 1250


async def test_a_gated_queue_is_never_handed_off_by_the_store(
    store_shape: TaskStore, now: datetime
) -> None:
    """A node whose gate has not read the pause (or the per-key limit) yet asks the store to
    hand tasks off: the fire and the submit make them READY instead."""
    out = await store_shape.submit(
        [TaskSpec(queue="hp", run_at=now + timedelta(seconds=1)) for _ in range(3)]
        + [TaskSpec(queue="hk", run_at=now + timedelta(seconds=1)) for _ in range(3)],
        now,
    )
    await store_shape.pause_queue("default", "hp", now, cap=10)
    await store_shape.set_queue("default", "hk", now, max_running_per_key=1, cap=10)
    owned = await _own_all(store_shape)
    ids = [o.task.id for o in out]
    at = now + timedelta(seconds=2)
    result = await store_shape.fire_listed(owned, at, ids, leases=dict.fromkeys(ids, "stale"))
    assert result.fired == 6 and result.leased == []
    for o in out:
        task = await store_shape.get(o.task.id, "default")
        assert task.state is TaskState.READY and task.worker_id is None
    for queue in ("hp", "hk"):
        handed = await store_shape.submit_leased(TaskSpec(queue=queue, run_at=at), at, "stale")
        assert handed.created and handed.task.state is TaskState.READY
        assert handed.task.worker_id is None
    # An open queue is still handed off.
    (o,) = await store_shape.submit([TaskSpec(queue="ho", run_at=now + timedelta(seconds=1))], now)
    open_ = await store_shape.fire_listed(owned, at, [o.task.id], leases={o.task.id: "w"})
    assert [t.id for t in open_.leased] == [o.task.id]


async def test_settings_are_read_back_bounded_and_removed_when_they_set_nothing(
    store_shape: TaskStore, now: datetime
) -> None:
    assert await store_shape.queue_settings("default", "q") == QueueSettings("default", "q")
    first = await store_shape.set_queue(
        "default", "q", now, max_running_per_key=2, max_starts_per_key=5.0, cap=2
    )
    assert (first.max_running_per_key, first.max_starts_per_key) == (2, 5.0)
    kept = await store_shape.set_queue("default", "q", now, max_starts_per_key=0.5, cap=2)
    assert (kept.max_running_per_key, kept.max_starts_per_key) == (2, 0.5)  # None: unchanged
    await store_shape.pause_queue("default", "r", now, cap=2)
    with pytest.raises(NamespaceCapReached):
        await store_shape.pause_queue("default", "s", now, cap=2)
    with pytest.raises(NamespaceCapReached):
        await store_shape.set_queue("default", "s", now, max_running_per_key=1, cap=2)
    await store_shape.pause_queue("other", "s", now, cap=2)  # the cap is per namespace
    assert [s.queue for s in await store_shape.list_queue_settings("default", limit=10)] == [
        "q",
        "r",
    ]
    assert {s.key for s in await store_shape.gated_queues()} == {
        ("default", "q"),
        ("default", "r"),
        ("other", "s"),
    }
    got = await store_shape.queue_settings("default", "r")
    assert got.paused and got.paused_at == now
    # Set back to nothing, a row goes, and frees its place under the cap.
    await store_shape.resume_queue("default", "r", now)
    await store_shape.set_queue(
        "default", "q", now, max_running_per_key=0, max_starts_per_key=0, cap=2
    )
    assert await store_shape.list_queue_settings("default", limit=10) == []
    await store_shape.pause_queue("default", "s", now, cap=2)
    # Resuming a queue that was never paused is a no-op answering the defaults.
    resumed = await store_shape.resume_queue("default", "never", now)
    assert resumed.settings == QueueSettings("default", "never", updated_at=now)
