"""Contract: listings filtered by labels, queue, state and run_at, and bulk cancel, requeue and
run now by filter: dry runs change nothing, a call's bound and token, and one namespace's
filter never touches another namespace's tasks."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from chronoq.errors import InvalidArgument
from chronoq.models import Lease, Task, TaskSpec, TaskState
from chronoq.store.port import TaskStore
from chronoq.taskfilter import BulkAction, TaskFilter

pytestmark = pytest.mark.timeout(60)

RED = (("color", "red"),)
BLUE = (("color", "blue"),)


async def _all(store: TaskStore, namespace: str = "default", **filters: object) -> list[Task]:
    """Every task a filtered listing gives, paging by 7 (tokens over shards and stretches)."""
    out: list[Task] = []
    token = ""
    for _ in range(1000):
        page = await store.list_tasks(
            namespace, page_size=7, page_token=token, **filters  # type: ignore[arg-type]
        )
        out += page.tasks
        token = page.next_token
        if not token:
            return out
    raise AssertionError("the listing did not end")


async def _states(store: TaskStore, namespace: str = "default") -> dict[str, TaskState]:
    return {t.id: t.state for t in await _all(store, namespace)}


async def _seed(store: TaskStore, now: datetime) -> dict[str, list[str]]:
    later = now + timedelta(hours=1)
    specs = (
        [TaskSpec(queue="a", run_at=later, labels=RED) for _ in range(30)]
        + [TaskSpec(queue="a", run_at=later, labels=BLUE) for _ in range(20)]
        + [TaskSpec(queue="b", run_at=later, labels=(*RED, ("tier", "gold"))) for _ in range(10)]
        + [TaskSpec(queue="a", run_at=now) for _ in range(5)]
        + [TaskSpec(queue="a", run_at=later, labels=RED, namespace="other") for _ in range(15)]
    )
    made = [o.task for o in await store.submit(specs, now)]
    out: dict[str, list[str]] = {}
    for t in made:
        key = f"{t.namespace}/{t.queue}/{dict(t.labels).get('color', '-')}"
        out.setdefault(key, []).append(t.id)
    return out


async def test_a_listing_filters_by_labels_queue_state_and_run_at(
    store_shape: TaskStore, now: datetime
) -> None:
    seeded = await _seed(store_shape, now)
    red = await _all(store_shape, labels=RED)
    assert sorted(t.id for t in red) == sorted(seeded["default/a/red"] + seeded["default/b/red"])
    assert len({t.id for t in red}) == len(red)  # nothing twice over pages and shards
    gold = await _all(store_shape, labels=(("color", "red"), ("tier", "gold")))
    assert sorted(t.id for t in gold) == sorted(seeded["default/b/red"])
    in_a = await _all(store_shape, labels=RED, queue="a")
    assert sorted(t.id for t in in_a) == sorted(seeded["default/a/red"])
    due = await _all(store_shape, run_at_to=now + timedelta(minutes=1))
    assert sorted(t.id for t in due) == sorted(seeded["default/a/-"])
    assert await _all(store_shape, run_at_from=now + timedelta(minutes=1), state=TaskState.READY) == []
    assert await _all(store_shape, labels=(("color", "green"),)) == []
    # the other namespace's red tasks are its own
    other = await _all(store_shape, "other", labels=RED)
    assert sorted(t.id for t in other) == sorted(seeded["other/a/red"])


async def test_a_dry_run_counts_and_changes_nothing(store_shape: TaskStore, now: datetime) -> None:
    seeded = await _seed(store_shape, now)
    before = await _states(store_shape)
    done = await store_shape.bulk_where(
        BulkAction.CANCEL, "default", TaskFilter(labels=RED), now, dry_run=True
    )
    assert done.outcome.count == len(seeded["default/a/red"]) + len(seeded["default/b/red"])
    assert done.outcome.dry_run and not done.outcome.more
    assert await _states(store_shape) == before
    assert not done.effects


async def test_bulk_cancel_by_label_changes_only_its_namespaces_matches(
    store_shape: TaskStore, now: datetime
) -> None:
    seeded = await _seed(store_shape, now)
    other_before = await _states(store_shape, "other")
    done = await store_shape.bulk_where(
        BulkAction.CANCEL, "default", TaskFilter(labels=RED, queue="a"), now
    )
    assert done.outcome.count == len(seeded["default/a/red"])
    states = await _states(store_shape)
    for task_id in seeded["default/a/red"]:
        assert states[task_id] is TaskState.CANCELLED
    for key in ("default/a/blue", "default/b/red"):
        assert all(states[i] is TaskState.SCHEDULED for i in seeded[key])
    # the attack: the same filter, from "default", never reaches namespace "other"
    assert await _states(store_shape, "other") == other_before
    again = await store_shape.bulk_where(
        BulkAction.CANCEL, "default", TaskFilter(labels=RED, queue="a"), now
    )
    assert again.outcome.count == 0


async def test_a_bulk_call_stops_at_its_bound_and_goes_on_from_its_token(
    store_shape: TaskStore, now: datetime
) -> None:
    seeded = await _seed(store_shape, now)
    where = TaskFilter(labels=RED)
    total = len(seeded["default/a/red"]) + len(seeded["default/b/red"])
    counted, token = 0, ""
    for _ in range(100):
        part = await store_shape.bulk_where(
            BulkAction.CANCEL, "default", where, now, dry_run=True, page_token=token, max_tasks=8
        )
        assert part.outcome.count <= 8
        counted += part.outcome.count
        token = part.outcome.next_token
        if not part.outcome.more:
            break
    assert counted == total
    changed, token = 0, ""
    for _ in range(100):
        part = await store_shape.bulk_where(
            BulkAction.CANCEL, "default", where, now, page_token=token, max_tasks=8
        )
        changed += part.outcome.count
        token = part.outcome.next_token
        if not part.outcome.more:
            break
    assert changed == total
    states = await _states(store_shape)
    assert sum(1 for s in states.values() if s is TaskState.CANCELLED) == total


async def test_run_now_makes_scheduled_tasks_ready_and_wakes_their_queue(
    store_shape: TaskStore, now: datetime
) -> None:
    seeded = await _seed(store_shape, now)
    done = await store_shape.bulk_where(BulkAction.RUN_NOW, "default", TaskFilter(labels=BLUE), now)
    assert done.outcome.count == len(seeded["default/a/blue"])
    assert done.effects.ready == {("default", "a"): len(seeded["default/a/blue"])}
    blue = await _all(store_shape, labels=BLUE)
    assert all(t.state is TaskState.READY and t.run_at <= now for t in blue)
    claimed = await store_shape.claim("default", ["a"], "w", 100, now)
    assert {t.id for t in claimed} >= set(seeded["default/a/blue"])


async def test_requeue_by_filter_takes_dead_tasks_only(store_shape: TaskStore, now: datetime) -> None:
    specs = [TaskSpec(queue="d", run_at=now, max_attempts=1, labels=RED) for _ in range(4)]
    specs += [TaskSpec(queue="d", run_at=now + timedelta(hours=1), labels=RED)]
    made = [o.task for o in await store_shape.submit(specs, now)]
    for task in await store_shape.claim("default", ["d"], "w", 4, now):
        await store_shape.fail("default", Lease(task.id, task.attempt), "boom", now)
    dry = await store_shape.bulk_where(
        BulkAction.REQUEUE, "default", TaskFilter(labels=RED), now, dry_run=True
    )
    assert dry.outcome.count == 4
    done = await store_shape.bulk_where(BulkAction.REQUEUE, "default", TaskFilter(labels=RED), now)
    assert done.outcome.count == 4
    states = await _states(store_shape)
    assert sorted(states[t.id] for t in made) == [TaskState.SCHEDULED] + [TaskState.READY] * 4
    # a state the action does not change matches nothing
    none = await store_shape.bulk_where(
        BulkAction.REQUEUE, "default", TaskFilter(state=TaskState.READY), now
    )
    assert none.outcome.count == 0


async def test_a_bad_token_is_refused(store_shape: TaskStore, now: datetime) -> None:
    with pytest.raises(InvalidArgument, match="page_token"):
        await store_shape.bulk_where(
            BulkAction.CANCEL, "default", TaskFilter(labels=RED), now, page_token="nope"
        )


async def test_cancelling_running_keyed_tasks_wakes_their_queue(
    store_shape: TaskStore, now: datetime
) -> None:
    await store_shape.submit(
        [
            TaskSpec(queue="k", run_at=now, concurrency_key="c1", labels=RED),
            TaskSpec(queue="plain", run_at=now, labels=RED),
        ],
        now,
    )
    await store_shape.claim("default", ["k", "plain"], "w", 2, now)
    done = await store_shape.bulk_where(
        BulkAction.CANCEL, "default", TaskFilter(labels=RED, state=TaskState.RUNNING), now
    )
    assert done.outcome.count == 2
    assert done.effects.ready == {("default", "k"): 1}  # the key's slot is free: claims wake


async def test_a_moving_partition_is_refused_whole_and_a_copy_is_left_alone(dsn: str) -> None:
    """A frozen partition's rows make the bulk statement fail whole (PartitionMoved: the
    caller retries once the map moved on), so none of them is passed over; rows of a
    partition this shard holds only as a copy (incoming) are not listed or changed here."""
    from chronoq.errors import PartitionMoved
    from tests.contract.conftest import START, holding

    async with holding(dsn, (0, 1, 2, 3)) as shard:
        store = shard.store
        later = START + timedelta(hours=1)

        async def put(partition: int, n: int) -> list[str]:
            specs = [TaskSpec(queue="m", run_at=later, labels=RED) for _ in range(n)]
            made = await store.submit(specs, START, partitions=[partition] * n)
            return [o.task.id for o in made]

        frozen, live = await put(2, 3), await put(3, 3)
        await shard.move_in([5], since_version=1)
        copies = await put(5, 2)
        await shard.mark_incoming([5])  # the move rolled back: these rows are another's now
        listed = {t.id for t in await _all(store, labels=RED)}
        assert listed == set(frozen + live)

        await shard.freeze([2])
        with pytest.raises(PartitionMoved):
            await store.bulk_where(BulkAction.CANCEL, "default", TaskFilter(labels=RED), START)
        assert {t.state for t in await _all(store, labels=RED)} == {TaskState.SCHEDULED}

        await shard.unfreeze([2])
        done = await store.bulk_where(BulkAction.CANCEL, "default", TaskFilter(labels=RED), START)
        assert done.outcome.count == 6
        for task_id in copies:  # another shard's rows: not changed here
            assert (await store.get(task_id, "default")).state is TaskState.SCHEDULED


async def test_a_bulk_requeue_keeps_one_pending_task_per_unique_key(
    store_shape: TaskStore, now: datetime
) -> None:
    """Dead letters of one unique key: the first is requeued, the others stay DEAD (a second
    pending task of the key would break the rule); so does one whose key is pending again."""
    specs = [TaskSpec(queue="u", run_at=now, max_attempts=1, unique_key="k1", labels=RED)]
    for _ in range(3):  # each dies before the next takes the key
        await store_shape.submit(specs, now)
        (task,) = await store_shape.claim("default", ["u"], "w", 1, now)
        await store_shape.fail("default", Lease(task.id, task.attempt), "boom", now)
    other = [TaskSpec(queue="u", run_at=now, max_attempts=1, unique_key="k2", labels=RED)]
    await store_shape.submit(other, now)
    (task,) = await store_shape.claim("default", ["u"], "w", 1, now)
    await store_shape.fail("default", Lease(task.id, task.attempt), "boom", now)
    await store_shape.submit(other, now)  # k2 is pending again
    done = await store_shape.bulk_where(BulkAction.REQUEUE, "default", TaskFilter(queue="u"), now)
    assert done.outcome.count == 1
    states = sorted(t.state for t in await _all(store_shape, labels=RED))
    assert states == [TaskState.READY] * 2 + [TaskState.DEAD] * 3


@pytest.fixture
def two_dsns(request: pytest.FixtureRequest) -> tuple[str, str]:
    from tests.contract.conftest import _prepare_two

    return _prepare_two(request)


async def test_over_shards_a_frozen_partition_is_waited_for_not_passed_over(
    two_dsns: tuple[str, str],
) -> None:
    """A freeze of a partition on one shard (a move's cut-over) while a bulk cancel runs: its
    rounds go again from the same position until the freeze ends, and every task is done."""
    import asyncio

    from tests.contract.conftest import START, TWO_SHARDS, open_two, shard_holder

    async with open_two(two_dsns) as sharded:
        later = START + timedelta(hours=1)
        specs = [TaskSpec(queue="m", run_at=later, labels=RED) for _ in range(200)]
        await sharded.submit(specs, START)
        moving = TWO_SHARDS.held_by("shard-1")[0]
        target = shard_holder(sharded, "shard-1")
        await target.freeze([moving])

        async def thaw() -> None:
            await asyncio.sleep(1.0)  # about a cut-over's freeze
            await target.unfreeze([moving])

        thawing = asyncio.ensure_future(thaw())
        done = await sharded.bulk_where(
            BulkAction.CANCEL, "default", TaskFilter(labels=RED), START
        )
        await thawing
        assert done.outcome.count == 200 and not done.outcome.more
        assert {t.state for t in await _all(sharded, labels=RED)} == {TaskState.CANCELLED}
