"""Contract: a store shard refuses every write of a partition it does not hold live at the
caller's map version (``PartitionMoved``, nothing of the call written), and goes on with the
partitions it holds.

The calls under test go through the port only (``TaskStore``, the schedule port); what the
shard holds is set up the way a deployment sets it (``holds`` on first connect, a move's
steps for a freeze), through the suite's ``Holder``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from chronoq.errors import PartitionMoved, TaskNotFound
from chronoq.models import Lease, ScheduleSpec, TaskSpec, TaskState
from chronoq.recurrence import Every
from chronoq.store.port import TaskStore
from tests.contract.conftest import START, Holder, holding

pytestmark = pytest.mark.timeout(60)

HELD = (0, 1, 2, 3)  # this shard's half; 4..7 are another shard's
FROZEN = 2
LEASE = timedelta(seconds=30)


@pytest.fixture
async def shard(dsn: str) -> AsyncIterator[Holder]:
    async with holding(dsn, HELD) as holder:
        yield holder


def spec(now: datetime = START, **kw: object) -> TaskSpec:
    return TaskSpec(queue="w", run_at=now, lease_timeout=LEASE, **kw)  # type: ignore[arg-type]


async def submit_to(
    store: TaskStore, partition: int, n: int = 1, now: datetime = START
) -> list[str]:
    out = await store.submit([spec(now) for _ in range(n)], now, partitions=[partition] * n)
    return [o.task.id for o in out]


async def total(store: TaskStore) -> int:
    return sum((await store.count_by_state()).values())


async def test_a_submit_to_a_partition_the_shard_does_not_hold_is_refused(shard: Holder) -> None:
    store = shard.store
    with pytest.raises(PartitionMoved, match="partition 5 is moving") as refused:
        await submit_to(store, 5)
    assert refused.value.partitions == (5,)
    assert await total(store) == 0
    # The gRPC edge answers it UNAVAILABLE, with the message that says to retry.
    assert PartitionMoved.grpc_code == "UNAVAILABLE"


async def test_a_batch_with_one_partition_elsewhere_writes_nothing(shard: Holder) -> None:
    store = shard.store
    specs = [spec() for _ in range(6)]
    with pytest.raises(PartitionMoved) as refused:
        await store.submit(specs, START, partitions=[0, 1, 2, 3, 6, 7])
    assert refused.value.partitions == (6, 7)
    assert await total(store) == 0
    ids = await store.submit_ids(specs[:4], START, partitions=[0, 1, 2, 3])
    assert len(ids) == 4 and await total(store) == 4


async def test_a_keyed_single_submit_elsewhere_is_refused_also_when_its_key_is_taken(
    shard: Holder,
) -> None:
    # One keyed spec is the submit's own statement (insert_task_once); its fence is checked
    # before its key, so a taken key answers nothing from a partition this shard does not hold.
    store = shard.store
    with pytest.raises(PartitionMoved) as refused:
        await store.submit([spec(idempotency_key="fresh")], START, partitions=[5])
    assert refused.value.partitions == (5,)
    assert await total(store) == 0
    (first,) = await store.submit([spec(idempotency_key="taken")], START, partitions=[1])
    with pytest.raises(PartitionMoved):
        await store.submit([spec(idempotency_key="taken")], START, partitions=[6])
    (again,) = await store.submit([spec(idempotency_key="taken")], START, partitions=[1])
    assert (again.task.id, again.created) == (first.task.id, False)
    assert await total(store) == 1


async def test_a_leased_submit_elsewhere_is_refused_also_when_its_key_is_taken(
    shard: Holder,
) -> None:
    # The hand-off (insert_task_leased) places the task by its key; one that lands on a
    # partition elsewhere is refused, also when the key's first task was placed here by hand.
    store = shard.store
    leased = 0
    for i in range(100):  # the first key placed elsewhere, found by its refusal
        key = f"elsewhere-{i}"
        try:
            await store.submit_leased(spec(idempotency_key=key), START, "w")
        except PartitionMoved as exc:
            assert exc.partitions[0] not in HELD
            break
        leased += 1
    else:
        pytest.fail("no key of 100 placed on a partition elsewhere")
    assert await total(store) == leased
    (first,) = await store.submit([spec(idempotency_key=key)], START, partitions=[1])
    with pytest.raises(PartitionMoved):
        await store.submit_leased(spec(idempotency_key=key), START, "w")
    assert (await store.get(first.task.id, "default")).state is TaskState.READY


async def test_a_frozen_partition_refuses_writes_while_the_others_go_on(shard: Holder) -> None:
    store = shard.store
    earlier = START - timedelta(seconds=1)  # claimed first (claims go by run_at)
    frozen_ids = await submit_to(store, FROZEN, 3, earlier)
    other_ids = await submit_to(store, 3, 3)
    # One of the frozen partition's tasks is leased before the freeze.
    (first,) = await store.claim("default", ["w"], "early", 1, START)
    assert first.partition == FROZEN
    await shard.freeze([FROZEN])

    with pytest.raises(PartitionMoved, match=f"partition {FROZEN} is moving"):
        await submit_to(store, FROZEN)
    assert len(await submit_to(store, 3)) == 1  # the others go on
    # Claims take only the held partitions' tasks; the frozen ones stay READY there.
    claimed = await store.claim("default", ["w"], "w1", 50, START)
    assert {t.partition for t in claimed} == {3} and len(claimed) == 4
    # By-id calls of the frozen partition are refused, whole: with another partition's
    # lease in the same call, that one is not completed either.
    lease = Lease(first.id, first.attempt)
    with pytest.raises(PartitionMoved):
        await store.complete("default", [lease, Lease(claimed[0].id, claimed[0].attempt)], START)
    with pytest.raises(PartitionMoved):
        await store.heartbeat("default", [lease], START)
    with pytest.raises(PartitionMoved):
        await store.fail("default", lease, "boom", START)
    with pytest.raises(PartitionMoved):
        await store.release("default", lease)
    with pytest.raises(PartitionMoved):
        await store.cancel(frozen_ids[-1], "default", START)
    assert (await store.get(claimed[0].id, "default")).state is TaskState.RUNNING
    # The other partition's acks go on.
    acks = await store.complete("default", [Lease(t.id, t.attempt) for t in claimed], START)
    assert all(a.ok for a in acks)
    assert set(other_ids) <= {t.id for t in claimed}
    # Rolled back, the partition takes writes again and its tasks are claimable.
    await shard.unfreeze([FROZEN])
    again = await store.claim("default", ["w"], "w2", 50, START)
    assert {t.id for t in again} == set(frozen_ids) - {first.id}
    assert (await store.complete("default", [lease], START))[0].ok


async def test_owner_statements_of_a_frozen_partition_fire_and_reap_nothing(shard: Holder) -> None:
    store = shard.store
    later = START + timedelta(minutes=2)
    await store.submit([spec(later)], START, partitions=[FROZEN])
    await store.submit([spec(later)], START, partitions=[1])
    owned = {}
    for p in HELD:
        fence = await store.take_fence(p, 1, "contract", "owner")
        assert fence is not None
        owned[p] = 1
    await shard.freeze([FROZEN])
    with pytest.raises(PartitionMoved):
        await store.fire_due(owned, later)
    assert (await store.count_by_state()).get(TaskState.READY, 0) == 0  # nothing fired
    with pytest.raises(PartitionMoved):
        await store.reap_expired(owned, later)
    with pytest.raises(PartitionMoved):
        await store.purge_finished([FROZEN], [TaskState.SUCCEEDED], later, 10)
    with pytest.raises(PartitionMoved):  # nor is a frozen partition's history swept
        await store.retire_finished(
            [FROZEN], later, later, retention=timedelta(days=7), width=timedelta(days=1), batch=10
        )
    # Without the frozen partition the owner fires the rest.
    fired = await store.fire_due({p: t for p, t in owned.items() if p != FROZEN}, later)
    assert fired.fired == 1


async def test_a_shard_made_live_at_a_later_version_refuses_callers_of_an_older_map(
    dsn: str,
) -> None:
    async with holding(dsn, ()) as target:
        store = target.store
        with pytest.raises(PartitionMoved):
            await submit_to(store, 4)  # nothing is held yet
        await target.mark_incoming([4])
        with pytest.raises(PartitionMoved):
            await submit_to(store, 4)  # incoming: the copy is not done
        await target.move_in([4], 3)
        target.routes_by(2)  # a node that has not read map version 3 yet
        with pytest.raises(PartitionMoved):
            await submit_to(store, 4)
        assert await store.claim("default", ["w"], "w", 10, START) == []
        target.routes_by(3)
        assert len(await submit_to(store, 4)) == 1
        assert len(await store.claim("default", ["w"], "w", 10, START)) == 1


async def test_schedules_of_a_partition_elsewhere_are_refused(shard: Holder) -> None:
    schedules = shard.schedules
    mine = shard.schedule_name_in((0, 1))
    theirs = shard.schedule_name_in((4, 5, 6, 7))
    every = Every(timedelta(minutes=1), START)
    with pytest.raises(PartitionMoved):
        await schedules.create(ScheduleSpec(name=theirs, queue="w", rule=every), START)
    created = await schedules.create(ScheduleSpec(name=mine, queue="w", rule=every), START)
    await shard.freeze([0, 1])
    with pytest.raises(PartitionMoved):
        await schedules.pause("default", mine, START)
    with pytest.raises(PartitionMoved):
        await schedules.delete("default", mine, START)
    assert (await schedules.get("default", mine)).id == created.id  # reads go on
    await shard.unfreeze([0, 1])
    assert (await schedules.pause("default", mine, START)).paused


async def test_a_by_id_call_of_a_partition_elsewhere_is_refused_not_answered_unknown(
    shard: Holder,
) -> None:
    """The id names its partition: a stale caller hears "moved" (and retries on the shard
    that holds it), never "no such task", even where this shard has no row of it."""
    store = shard.store
    elsewhere = shard.task_id_in(6)
    with pytest.raises(PartitionMoved) as refused:
        await store.cancel(elsewhere, "default", START)
    assert refused.value.partitions == (6,)
    with pytest.raises(PartitionMoved):
        await store.complete("default", [Lease(elsewhere, 1)], START)
    with pytest.raises(PartitionMoved):
        await store.requeue("default", [elsewhere], START)
    # An id of a held partition with no row is still unknown.
    missing = shard.task_id_in(1)
    with pytest.raises(TaskNotFound):
        await store.get(missing, "default")
