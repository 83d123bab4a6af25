"""Contract: unique tasks and debounce, through the port only (docs/unique-and-debounce.md).

A unique key admits one pending task (SCHEDULED, READY or RUNNING), or with ``unique_for``
one task per window; a debounce key folds a burst of submits into one task that has not
started, run ``debounce`` after the last of them and never later than ``debounce_max`` after
the first. Keys are per namespace."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from chronoq.errors import InvalidTransition, PartitionMoved
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)

S = timedelta(seconds=1)


def unique(key: str, run_at: datetime, payload: bytes = b"", **kw: object) -> TaskSpec:
    return TaskSpec(queue="u", run_at=run_at, payload=payload, unique_key=key, **kw)  # type: ignore[arg-type]


def bounce(
    key: str, now: datetime, payload: bytes, debounce: timedelta = 10 * S, **kw: object
) -> TaskSpec:
    return TaskSpec(  # type: ignore[arg-type]
        queue="d", run_at=now, payload=payload, debounce_key=key, debounce=debounce, **kw
    )


async def own_all(store: TaskStore) -> dict[int, int]:
    owned = {}
    for p in range(PARTITIONS):
        fence = await store.take_fence(p, 5, "contract", "me")
        assert fence is not None
        owned[p] = 5
    return owned


# ---------------------------------------------------------------- unique while pending


async def test_a_second_submit_of_a_pending_unique_key_answers_the_first_task(
    store_shape: TaskStore, now: datetime
) -> None:
    (first,) = await store_shape.submit([unique("k", now + 60 * S, b"one")], now)
    (again,) = await store_shape.submit([unique("k", now + 5 * S, b"two")], now)
    assert first.created and not again.created
    assert again.task.id == first.task.id and again.task.payload == b"one"
    assert again.task.run_at == now + 60 * S  # the first task is left as it was
    # The ids-only answer says the same.
    (ids,) = await store_shape.submit_ids([unique("k", now, b"three")], now)
    assert ids == (first.task.id, False)


async def test_a_unique_key_is_per_namespace(store_shape: TaskStore, now: datetime) -> None:
    (a,) = await store_shape.submit([unique("k", now + 60 * S)], now)
    (b,) = await store_shape.submit(
        [TaskSpec(queue="u", run_at=now + 60 * S, unique_key="k", namespace="other")], now
    )
    assert a.created and b.created and a.task.id != b.task.id


async def test_running_counts_as_pending_and_a_finished_task_frees_the_key(
    store_shape: TaskStore, now: datetime
) -> None:
    (first,) = await store_shape.submit([unique("k", now)], now)  # READY at once
    (claimed,) = await store_shape.claim("default", ["u"], "w", 1, now)
    assert claimed.id == first.task.id and claimed.state is TaskState.RUNNING
    (during,) = await store_shape.submit([unique("k", now)], now)
    assert not during.created and during.task.id == first.task.id
    (ack,) = await store_shape.complete("default", [Lease(claimed.id, claimed.attempt)], now)
    assert ack.ok
    (after,) = await store_shape.submit([unique("k", now)], now)
    assert after.created and after.task.id != first.task.id
    # Cancelled frees it too.
    await store_shape.cancel(after.task.id, "default", now)
    (third,) = await store_shape.submit([unique("k", now)], now)
    assert third.created


async def test_a_retried_unique_task_keeps_its_key(store_shape: TaskStore, now: datetime) -> None:
    """A running task that fails goes back to SCHEDULED: no second task got in meanwhile, so
    the retry's write never collides (the reason RUNNING counts as pending)."""
    (first,) = await store_shape.submit([unique("k", now, max_attempts=3)], now)
    (claimed,) = await store_shape.claim("default", ["u"], "w", 1, now)
    (refused,) = await store_shape.submit([unique("k", now)], now)
    assert not refused.created
    failed = await store_shape.fail("default", Lease(claimed.id, claimed.attempt), "boom", now)
    assert failed.state in (TaskState.SCHEDULED, TaskState.READY)
    (still,) = await store_shape.submit([unique("k", now)], now)
    assert not still.created and still.task.id == first.task.id


async def test_one_batch_with_one_unique_key_twice_makes_one_task(
    store_shape: TaskStore, now: datetime
) -> None:
    specs = [
        unique("k", now + 60 * S, b"1"),
        TaskSpec(queue="u", run_at=now),
        unique("k", now + 60 * S, b"2"),
        unique("j", now + 60 * S, b"3"),
    ]
    out = await store_shape.submit(specs, now)
    assert [o.created for o in out] == [True, True, False, True]
    assert out[2].task.id == out[0].task.id and out[2].task.payload == b"1"
    ids = await store_shape.submit_ids(
        [unique("x", now + 60 * S), unique("x", now + 60 * S)], now
    )
    assert ids[0][1] and not ids[1][1] and ids[1][0] == ids[0][0]


async def test_the_idempotency_key_is_checked_first(store_shape: TaskStore, now: datetime) -> None:
    """A repeated request answers its first task, even once the unique key is free again."""
    (first,) = await store_shape.submit([unique("k", now, idempotency_key="req-1")], now)
    await store_shape.cancel(first.task.id, "default", now)
    (again,) = await store_shape.submit([unique("k", now, idempotency_key="req-1")], now)
    assert not again.created and again.task.id == first.task.id
    (other,) = await store_shape.submit([unique("k", now, idempotency_key="req-2")], now)
    assert other.created


async def test_a_dead_task_is_not_requeued_beside_a_pending_one_of_its_key(
    store_shape: TaskStore, now: datetime
) -> None:
    (first,) = await store_shape.submit([unique("k", now, max_attempts=1)], now)
    (claimed,) = await store_shape.claim("default", ["u"], "w", 1, now)
    dead = await store_shape.fail("default", Lease(claimed.id, claimed.attempt), "x", now)
    assert dead.state is TaskState.DEAD
    (second,) = await store_shape.submit([unique("k", now)], now)
    assert second.created
    with pytest.raises(InvalidTransition, match="unique_key"):
        await store_shape.requeue("default", [first.task.id], now)
    await store_shape.cancel(second.task.id, "default", now)
    (back,) = await store_shape.requeue("default", [first.task.id], now)
    assert back.state is TaskState.READY


# ---------------------------------------------------------------- unique for a window


async def test_unique_for_holds_the_key_for_its_window_whatever_the_state(
    store_shape: TaskStore, now: datetime
) -> None:
    hour = timedelta(hours=1)
    (first,) = await store_shape.submit([unique("w", now, b"1", unique_for=hour)], now)
    assert first.task.unique_until == now + hour
    (claimed,) = await store_shape.claim("default", ["u"], "w", 1, now)
    await store_shape.complete("default", [Lease(claimed.id, claimed.attempt)], now)
    later = now + 30 * 60 * S
    (inside,) = await store_shape.submit([unique("w", later, b"2", unique_for=hour)], later)
    assert not inside.created and inside.task.id == first.task.id
    assert inside.task.state is TaskState.SUCCEEDED
    past = now + hour
    (after,) = await store_shape.submit([unique("w", past, b"3", unique_for=hour)], past)
    assert after.created and after.task.unique_until == past + hour
    (next_one,) = await store_shape.submit([unique("w", past, b"4", unique_for=hour)], past)
    assert not next_one.created and next_one.task.id == after.task.id


async def test_retention_keeps_a_task_while_its_window_holds_the_key(
    store_shape: TaskStore, now: datetime
) -> None:
    """A finished task purged by retention would free its key before its window ended."""
    month = timedelta(days=30)
    (first,) = await store_shape.submit([unique("w", now, unique_for=month)], now)
    (claimed,) = await store_shape.claim("default", ["u"], "w", 1, now)
    await store_shape.complete("default", [Lease(claimed.id, claimed.attempt)], now)
    week_later = now + timedelta(days=8)  # past a 7-day retention, inside the window
    every = list(range(PARTITIONS))
    assert await store_shape.purge_finished(every, [TaskState.SUCCEEDED], week_later, 10) == 0
    (inside,) = await store_shape.submit([unique("w", week_later, unique_for=month)], week_later)
    assert not inside.created and inside.task.id == first.task.id
    after = now + month + timedelta(days=1)
    assert await store_shape.purge_finished(every, [TaskState.SUCCEEDED], after, 10) == 1


async def test_a_window_counts_from_the_first_tasks_run_at(
    store_shape: TaskStore, now: datetime
) -> None:
    run_at = now + timedelta(hours=2)
    (first,) = await store_shape.submit(
        [unique("w", run_at, unique_for=timedelta(minutes=5))], now
    )
    at = now + timedelta(hours=2, minutes=4)  # before run_at + 5 min
    (inside,) = await store_shape.submit([unique("w", at, unique_for=timedelta(minutes=5))], at)
    assert not inside.created and inside.task.id == first.task.id


# ---------------------------------------------------------------- debounce


async def test_a_burst_of_debounced_submits_is_one_task_after_the_last(
    store_shape: TaskStore, now: datetime
) -> None:
    (first,) = await store_shape.submit([bounce("b", now, b"1")], now)
    assert first.created and first.task.state is TaskState.SCHEDULED
    assert first.task.run_at == now + 10 * S
    assert first.task.debounce_until == now + 100 * S  # 10 x the debounce by default
    at = now + 4 * S
    (second,) = await store_shape.submit([bounce("b", at, b"2")], at)
    assert not second.created and second.task.id == first.task.id
    assert second.task.payload == b"2" and second.task.run_at == at + 10 * S
    owned = await own_all(store_shape)
    # Due at its old time no more: nothing fires then; it fires at its new time, once.
    assert (await store_shape.fire_due(owned, now + 11 * S)).fired == 0
    assert (await store_shape.get(first.task.id, "default")).state is TaskState.SCHEDULED
    assert (await store_shape.fire_due(owned, at + 10 * S)).fired == 1
    # Once READY, the next trigger makes a new task.
    later = at + 11 * S
    (third,) = await store_shape.submit([bounce("b", later, b"3")], later)
    assert third.created and third.task.id != first.task.id


async def test_a_debounce_moves_its_task_into_the_bucket_of_its_new_time(
    store_shape: TaskStore, now: datetime
) -> None:
    """START is 10 s into a minute's bucket: 55 s of debounce lands in the next bucket, which
    the fire of the old bucket's end must not take."""
    (first,) = await store_shape.submit([bounce("b", now, b"1", 30 * S)], now)
    at = now + 25 * S
    (moved,) = await store_shape.submit([bounce("b", at, b"2", 30 * S)], at)
    assert moved.task.run_at == now + 55 * S
    assert moved.task.bucket == first.task.bucket + 1
    owned = await own_all(store_shape)
    assert (await store_shape.fire_due(owned, now + 49 * S)).fired == 0
    assert (await store_shape.fire_due(owned, now + 55 * S)).fired == 1


async def test_a_debounce_never_postpones_past_debounce_max(
    store_shape: TaskStore, now: datetime
) -> None:
    most = 25 * S
    (first,) = await store_shape.submit([bounce("b", now, b"0", debounce_max=most)], now)
    last = first
    for i in range(1, 12):  # a trigger every 3 s for 33 s
        at = now + 3 * i * S
        (last,) = await store_shape.submit([bounce("b", at, str(i).encode(), debounce_max=most)], at)
        assert last.task.id == first.task.id
        assert last.task.run_at == min(at + 10 * S, now + most)
    assert last.task.run_at == now + most and last.task.payload == b"11"


async def test_a_debounce_key_is_per_namespace(store_shape: TaskStore, now: datetime) -> None:
    """Another namespace's submit with the same key cannot postpone (or rewrite) this task."""
    (mine,) = await store_shape.submit([bounce("b", now, b"mine")], now)
    at = now + 5 * S
    (theirs,) = await store_shape.submit(
        [bounce("b", at, b"theirs", namespace="attacker")], at
    )
    assert theirs.created and theirs.task.id != mine.task.id
    kept = await store_shape.get(mine.task.id, "default")
    assert (kept.run_at, kept.payload) == (now + 10 * S, b"mine")


async def test_a_started_debounced_task_is_left_alone(store_shape: TaskStore, now: datetime) -> None:
    """A retry waiting SCHEDULED has run once: a new trigger makes a new task, and the retry
    never collides with it."""
    (first,) = await store_shape.submit([bounce("b", now, b"1", max_attempts=3)], now)
    owned = await own_all(store_shape)
    at = now + 10 * S
    assert (await store_shape.fire_due(owned, at)).fired == 1
    (claimed,) = await store_shape.claim("default", ["d"], "w", 1, at)
    (second,) = await store_shape.submit([bounce("b", at, b"2")], at)
    assert second.created
    retried = await store_shape.fail(
        "default", Lease(claimed.id, claimed.attempt), "x", at, retry_after=60 * S
    )
    assert retried.state is TaskState.SCHEDULED
    (third,) = await store_shape.submit([bounce("b", at, b"3")], at)
    assert third.task.id == second.task.id and third.task.payload == b"3"
    assert (await store_shape.get(first.task.id, "default")).payload == b"1"


async def test_a_repeated_debounced_request_moves_nothing(
    store_shape: TaskStore, now: datetime
) -> None:
    (first,) = await store_shape.submit([bounce("b", now, b"1", idempotency_key="r1")], now)
    at = now + 5 * S
    (again,) = await store_shape.submit([bounce("b", at, b"1", idempotency_key="r1")], at)
    assert not again.created and again.task.id == first.task.id
    assert again.task.run_at == now + 10 * S


async def test_one_batch_with_one_debounce_key_twice_makes_one_task(
    store_shape: TaskStore, now: datetime
) -> None:
    out = await store_shape.submit([bounce("b", now, b"1"), bounce("b", now, b"2")], now)
    assert out[0].created and not out[1].created and out[0].task.id == out[1].task.id
    assert (await store_shape.get(out[0].task.id, "default")).payload == b"2"
    accepted = await store_shape.submit_ids([bounce("c", now, b"1"), bounce("c", now, b"2")], now)
    assert accepted[0][1] and accepted[1] == (accepted[0][0], False)
    # The moved task is offered to the wheel at its instant (the effects of the submit).
    assert [s[0] for s in accepted.effects.scheduled] == [accepted[0][0]] * 2


async def test_the_wheel_never_fires_a_debounced_task_at_its_old_time(
    store_shape: TaskStore, now: datetime
) -> None:
    """The owner's wheel listed the task at its old instant; the debounce moved it: the fire
    of the listed id at the old instant fires nothing, leased or not; at the new one it does."""
    (first,) = await store_shape.submit([bounce("b", now, b"1")], now)
    owned = await own_all(store_shape)
    listed = await store_shape.due_soon(list(owned), now, now + 20 * S, limit=10)
    assert [r[0] for r in listed] == [first.task.id]
    at = now + 5 * S
    await store_shape.submit([bounce("b", at, b"2")], at)
    old = now + 10 * S
    assert (await store_shape.fire_listed(owned, old, [first.task.id])).fired == 0
    leasing = await store_shape.fire_listed(
        owned, old, [first.task.id], leases={first.task.id: "w"}
    )
    assert leasing.fired == 0 and not leasing.leased
    assert (await store_shape.get(first.task.id, "default")).state is TaskState.SCHEDULED
    assert (await store_shape.fire_listed(owned, at + 10 * S, [first.task.id])).fired == 1


async def test_a_debounced_unique_task_is_moved_then_answered_once_started(
    store_shape: TaskStore, now: datetime
) -> None:
    (first,) = await store_shape.submit([bounce("b", now, b"1", unique_key="u")], now)
    at = now + 5 * S
    (moved,) = await store_shape.submit([bounce("b", at, b"2", unique_key="u")], at)
    assert moved.task.id == first.task.id and moved.task.payload == b"2"
    owned = await own_all(store_shape)
    assert (await store_shape.fire_due(owned, at + 10 * S)).fired == 1  # READY: started
    later = at + 11 * S
    (answered,) = await store_shape.submit([bounce("b", later, b"3", unique_key="u")], later)
    assert not answered.created and answered.task.id == first.task.id
    assert answered.task.state is TaskState.READY and answered.task.payload == b"2"


async def test_one_batch_of_one_debounce_key_acts_as_its_submits_one_after_another(
    store_shape: TaskStore, now: datetime
) -> None:
    """The task is made from the first spec, runs at the latest of their instants and holds
    the last one's payload; a key already pending moves the same way."""
    specs = [
        bounce("b", now, b"1", 10 * S, priority=7),
        bounce("b", now, b"2", 30 * S),
        bounce("b", now, b"3", 20 * S),
    ]
    out = await store_shape.submit(specs, now)
    assert [o.created for o in out] == [True, False, False]
    task = await store_shape.get(out[0].task.id, "default")
    assert {o.task.id for o in out} == {task.id}
    assert (task.run_at, task.payload, task.priority) == (now + 30 * S, b"3", 7)
    at = now + 5 * S
    again = await store_shape.submit(
        [bounce("b", at, b"4", 40 * S), bounce("b", at, b"5", 10 * S)], at
    )
    assert [o.created for o in again] == [False, False]
    moved = await store_shape.get(task.id, "default")
    assert (moved.run_at, moved.payload) == (at + 40 * S, b"5")


async def test_a_debounce_or_a_window_of_a_frozen_partition_is_refused_whole(dsn: str) -> None:
    """The keyed writes are fenced like every write: a shard that no longer holds the key's
    partition live moves nothing and closes no window (PartitionMoved, retried elsewhere)."""
    from tests.contract.conftest import START, holding

    async with holding(dsn, range(PARTITIONS)) as shard:
        store = shard.store
        (first,) = await store.submit([bounce("b", START, b"1")], START)
        hour = timedelta(hours=1)
        (window,) = await store.submit([unique("w", START, unique_for=hour)], START)
        await store.cancel(window.task.id, "default", START)  # only its window holds the key
        await shard.freeze(sorted({first.task.partition, window.task.partition}))
        at = START + 5 * S
        with pytest.raises(PartitionMoved):
            await store.submit([bounce("b", at, b"2")], at)
        kept = await store.get(first.task.id, "default")
        assert (kept.run_at, kept.payload) == (first.task.run_at, b"1")
        later = START + 2 * hour
        with pytest.raises(PartitionMoved):
            await store.submit([unique("w", later, unique_for=hour)], later)
        await shard.unfreeze(sorted({first.task.partition, window.task.partition}))
        (again,) = await store.submit([unique("w", START + 30 * 60 * S, unique_for=hour)], START)
        assert not again.created and again.task.id == window.task.id  # its window still holds
