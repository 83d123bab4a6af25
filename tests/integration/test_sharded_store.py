"""A store of two shards on two real databases when one shard is down: calls of the other
shard's tasks still work, calls over both skip the down one and say so where the answer
can, a batch that reached one shard says what it accepted, and repeating it completes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from chronoq.errors import BatchPartlyAccepted, RequeuePartlyDone, ShardUnavailable
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.store.sharded import ShardedStore
from tests.contract.conftest import PARTITIONS, TWO_SHARDS, connect_shard, open_two

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)


@pytest.fixture
async def sharded(two_dsns: tuple[str, str]) -> AsyncIterator[ShardedStore]:
    async with open_two(two_dsns) as store:
        yield store


def on_shard_0(partition: int) -> bool:
    return TWO_SHARDS.shard_of(partition) == "shard-0"


async def test_by_id_calls_reach_only_their_shard(sharded: ShardedStore) -> None:
    out = await sharded.submit([TaskSpec(queue="q", run_at=NOW) for _ in range(40)], NOW)
    here = [o.task for o in out if on_shard_0(o.task.partition)]
    there = [o.task for o in out if not on_shard_0(o.task.partition)]
    assert here and there
    await sharded.stores["shard-1"].close()  # shard-1 is gone

    for task in here:  # each call reaches shard-0 alone: shard-1's outage does not touch it
        assert (await sharded.get(task.id, "default")).id == task.id
    cancelled = await sharded.cancel(here[0].id, "default", NOW)
    assert cancelled.state is TaskState.CANCELLED
    with pytest.raises(ShardUnavailable, match="store shard-1") as down:
        await sharded.get(there[0].id, "default")
    assert down.value.shard == "shard-1"


async def test_calls_over_both_shards_skip_the_down_one(sharded: ShardedStore) -> None:
    out = await sharded.submit([TaskSpec(queue="q", run_at=NOW) for _ in range(40)], NOW)
    on_0 = sum(1 for o in out if on_shard_0(o.task.partition))
    await sharded.stores["shard-1"].close()

    assert await sharded.count_by_state() == {TaskState.READY: on_0}
    per_shard = await sharded.count_by_state_per_shard()
    assert per_shard == {"shard-0": {TaskState.READY: on_0}, "shard-1": None}
    claimed = await sharded.claim("default", ["q"], "w", 100, NOW)
    assert len(claimed) == on_0 and all(on_shard_0(t.partition) for t in claimed)
    fired = await sharded.fire_due({p: 1 for p in range(PARTITIONS)}, NOW)  # unfenced: nothing
    assert fired.fired == 0
    assert not await sharded.probe() and await sharded.probe_shard("shard-0")
    assert not await sharded.probe_shard("shard-1")
    # A listing does not skip: its token would walk past the down shard's tasks for good.
    with pytest.raises(ShardUnavailable, match="shard-1"):
        await sharded.list_tasks("default")


async def test_a_batch_that_reached_one_shard_says_so_and_a_repeat_completes_it(
    sharded: ShardedStore, two_dsns: tuple[str, str]
) -> None:
    specs = [TaskSpec(queue="q", run_at=NOW, idempotency_key=f"k{i}") for i in range(30)]
    await sharded.stores["shard-1"].close()

    with pytest.raises(BatchPartlyAccepted) as partly:
        await sharded.submit(specs, NOW)

    accepted = partly.value.accepted
    assert partly.value.shards == ("shard-1",) and partly.value.total == 30
    assert "outcome unknown" in partly.value.message  # the SDK repeats such a batch
    assert accepted and all(created for _i, _id, created in accepted)
    for _pos, task_id, _created in accepted:
        assert on_shard_0((await sharded.get(task_id, "default")).partition)
    # shard-1 is back; the same batch again accepts the rest and duplicates nothing.
    sharded.add_store("shard-1", await connect_shard(two_dsns[1], TWO_SHARDS.held_by("shard-1")))
    again = await sharded.submit(specs, NOW)
    first = {pos: task_id for pos, task_id, _c in accepted}
    for pos, o in enumerate(again):
        if pos in first:
            assert (o.task.id, o.created) == (first[pos], False)
        else:
            assert o.created
    assert await sharded.count_by_state() == {TaskState.READY: 30}
    await sharded.stores["shard-1"].close()


async def test_a_requeue_that_reached_one_shard_names_what_it_requeued(
    sharded: ShardedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard's part of a requeue is all or none; a shard lost after the others
    committed leaves an answer naming the ids requeued, and those alone are READY."""
    await sharded.submit([TaskSpec(queue="q", run_at=NOW, max_attempts=1) for _ in range(20)], NOW)
    claimed = await sharded.claim("default", ["q"], "w", 20, NOW)
    for task in claimed:
        await sharded.fail("default", Lease(task.id, task.attempt), "boom", NOW)
    dead = [t.id for t in claimed]
    assert {on_shard_0(t.partition) for t in claimed} == {True, False}
    lost = sharded.stores["shard-1"]
    requeue = lost.requeue

    async def lost_midway(*args: Any, **kwargs: Any) -> Any:
        await lost.close()  # the shard goes away once every id was read as DEAD
        return await requeue(*args, **kwargs)

    monkeypatch.setattr(lost, "requeue", lost_midway)
    with pytest.raises(RequeuePartlyDone, match="store shard-1") as partly:
        await sharded.requeue("default", dead, NOW)
    on_0 = {t.id for t in claimed if on_shard_0(t.partition)}
    assert set(partly.value.requeued) == on_0 and partly.value.total == len(dead)
    for task_id in on_0:
        assert (await sharded.get(task_id, "default")).state is TaskState.READY
