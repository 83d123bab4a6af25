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
