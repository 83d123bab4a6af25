"""Contract: finished tasks move into the task history and leave it by whole time slices,
through the port only (the sweep, the slice upkeep, reads and keyed submits)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from chronoq.errors import InvalidTransition, TaskNotFound
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS

pytestmark = pytest.mark.timeout(60)

ALL = list(range(PARTITIONS))
RETENTION = timedelta(hours=1)
WIDTH = timedelta(minutes=10)


async def sweep(store: TaskStore, now: datetime, *, after: timedelta = timedelta(0)) -> int:
    """One pass as the node runs it: slices first, then every finished row moved."""
    await store.keep_history(now, retention=RETENTION, width=WIDTH)
    moved = 0
    for _ in range(100):
        done = await store.retire_finished(
            ALL, now - after, now, retention=RETENTION, width=WIDTH, batch=50
        )
        moved += done.gone
        if done.gone < 50:
            return moved
    raise AssertionError("the sweep never ended")


async def cancelled(store: TaskStore, now: datetime, n: int, **spec: object) -> list[str]:
    outs = await store.submit(
        [
            TaskSpec(queue="q", run_at=now + timedelta(minutes=5), namespace="h", **spec)  # type: ignore[arg-type]
            for _ in range(n)
        ],
        now,
    )
    for o in outs:
        await store.cancel(o.task.id, "h", now)
    return [o.task.id for o in outs]


async def listed(store: TaskStore, state: TaskState | None = None) -> list[str]:
    ids: list[str] = []
    token = ""
    for _ in range(100):
        page = await store.list_tasks("h", state=state, page_size=7, page_token=token)
        ids += [t.id for t in page.tasks]
        if not (token := page.next_token):
            return ids
    raise AssertionError("the listing never ended")


async def test_a_finished_task_is_read_and_listed_after_it_moved(
    store_shape: TaskStore, now: datetime
) -> None:
    ids = await cancelled(store_shape, now, 20)
    live = await store_shape.submit([TaskSpec(queue="q", run_at=now, namespace="h")], now)
    later = now + timedelta(seconds=1)
    assert await sweep(store_shape, later) == 20
    assert await sweep(store_shape, later) == 0  # moved once
    for task_id in ids:
        task = await store_shape.get(task_id, "h")
        assert task.state is TaskState.CANCELLED and task.finished_at == now
    with pytest.raises(TaskNotFound):
        await store_shape.get(ids[0], "other")  # still seen only in its namespace
    with pytest.raises(InvalidTransition, match="CANCELLED"):  # never written again
        await store_shape.cancel(ids[0], "h", later)
    assert sorted(await listed(store_shape, TaskState.CANCELLED)) == sorted(ids)
    everything = await listed(store_shape)
    assert sorted(everything) == sorted([*ids, live[0].task.id])
    assert everything == sorted(everything, key=lambda i: i.replace("-", ""))  # keyset by id
    counts = await store_shape.count_by_state()
    assert counts.get(TaskState.READY) == 1


async def test_a_recently_finished_task_stays_until_history_after(
    store_shape: TaskStore, now: datetime
) -> None:
    await cancelled(store_shape, now, 3)
    assert await sweep(store_shape, now + timedelta(seconds=30), after=timedelta(minutes=1)) == 0
    assert await sweep(store_shape, now + timedelta(seconds=61), after=timedelta(minutes=1)) == 3


async def test_a_completed_task_moves_and_keeps_what_it_ended_with(
    store_shape: TaskStore, now: datetime
) -> None:
    (out,) = await store_shape.submit([TaskSpec(queue="q", run_at=now, namespace="h")], now)
    (claimed,) = await store_shape.claim("h", ["q"], "w", 1, now)
    await store_shape.complete("h", [Lease(claimed.id, claimed.attempt)], now)
    before = await store_shape.get(out.task.id, "h")
    assert before.state is TaskState.SUCCEEDED
    assert await sweep(store_shape, now + timedelta(seconds=1)) == 1
    assert await store_shape.get(out.task.id, "h") == before


async def test_a_keyed_submit_answers_the_first_task_after_it_moved(
    store_shape: TaskStore, now: datetime
) -> None:
    (first,) = await cancelled(store_shape, now, 1, idempotency_key="k1")
    (second,) = await cancelled(store_shape, now, 1, idempotency_key="k2")
    (third,) = await cancelled(store_shape, now, 1, idempotency_key="k4", unique_key="u")
    later = now + timedelta(seconds=1)
    assert await sweep(store_shape, later) == 3
    again = TaskSpec(queue="q", run_at=later, namespace="h", idempotency_key="k1")
    (out,) = await store_shape.submit([again], later)
    assert not out.created and out.task.id == first and out.task.state is TaskState.CANCELLED
    accepted = await store_shape.submit_ids(
        [again, TaskSpec(queue="q", run_at=later, namespace="h", idempotency_key="k3")], later
    )
    assert accepted[0] == (first, False) and accepted[1][1]
    leased = await store_shape.submit_leased(
        TaskSpec(queue="q", run_at=later, namespace="h", idempotency_key="k2"), later, "w"
    )
    assert not leased.created and leased.task.id == second
    # with a unique key beside it (the keyed path), the same
    keyed = TaskSpec(queue="q", run_at=later, namespace="h", idempotency_key="k4", unique_key="u")
    (out,) = await store_shape.submit([keyed], later)
    assert not out.created and out.task.id == third
    assert sorted(await listed(store_shape)) == sorted([first, second, third, accepted[1][0]])


async def test_a_slice_past_its_bound_is_dropped_with_its_rows_and_keys(
    store_shape: TaskStore, now: datetime
) -> None:
    (old,) = await cancelled(store_shape, now, 1, idempotency_key="k")
    assert await sweep(store_shape, now + timedelta(seconds=1)) == 1
    # retire_at = now + 1 h; its slice ends at most WIDTH later
    done = await store_shape.keep_history(
        now + RETENTION - timedelta(seconds=1), retention=RETENTION, width=WIDTH
    )
    assert done.dropped == 0 or (await store_shape.get(old, "h")).id == old
    assert (await store_shape.get(old, "h")).id == old  # not yet: its slice has not ended
    gone_at = now + RETENTION + WIDTH
    done = await store_shape.keep_history(gone_at, retention=RETENTION, width=WIDTH)
    assert done.dropped >= 1
    with pytest.raises(TaskNotFound):
        await store_shape.get(old, "h")
    assert await listed(store_shape) == []
    (out,) = await store_shape.submit(
        [TaskSpec(queue="q", run_at=gone_at, namespace="h", idempotency_key="k")], gone_at
    )
    assert out.created and out.task.id != old  # the key can be used again


async def test_a_row_already_past_its_retention_is_deleted_not_moved(
    store_shape: TaskStore, now: datetime
) -> None:
    (old,) = await cancelled(store_shape, now, 1)
    late = now + RETENTION + timedelta(seconds=1)
    await store_shape.keep_history(late, retention=RETENTION, width=WIDTH)
    done = await store_shape.retire_finished(
        ALL, late, late, retention=RETENTION, width=WIDTH, batch=10
    )
    assert (done.gone, done.kept) == (1, 0)
    with pytest.raises(TaskNotFound):
        await store_shape.get(old, "h")


async def test_dead_letters_stay_in_the_live_table(store_shape: TaskStore, now: datetime) -> None:
    await store_shape.submit([TaskSpec(queue="q", run_at=now, namespace="h", max_attempts=1)], now)
    (claimed,) = await store_shape.claim("h", ["q"], "w", 1, now)
    dead = await store_shape.fail("h", Lease(claimed.id, 1), "boom", now)
    assert dead.state is TaskState.DEAD
    assert await sweep(store_shape, now + timedelta(minutes=5)) == 0
    (requeued,) = await store_shape.requeue("h", [dead.id], now + timedelta(minutes=5))
    assert requeued.state is TaskState.READY


async def test_a_row_holding_an_open_unique_window_stays(
    store_shape: TaskStore, now: datetime
) -> None:
    spec = TaskSpec(
        queue="q",
        run_at=now,
        namespace="h",
        unique_key="u",
        unique_for=timedelta(minutes=10),
    )
    (out,) = await store_shape.submit([spec], now)
    await store_shape.cancel(out.task.id, "h", now)
    assert await sweep(store_shape, now + timedelta(minutes=5)) == 0
    (again,) = await store_shape.submit([spec], now + timedelta(minutes=5))
    assert not again.created and again.task.id == out.task.id  # the window still holds
    assert await sweep(store_shape, now + timedelta(minutes=11)) == 1


async def test_a_filtered_listing_finds_moved_tasks_beside_live_ones(
    store_shape: TaskStore, now: datetime
) -> None:
    moved = await cancelled(store_shape, now, 6, labels=(("team", "a"),))
    await cancelled(store_shape, now, 4, labels=(("team", "b"),))
    later = now + timedelta(seconds=1)
    assert await sweep(store_shape, later) == 10
    (live,) = await store_shape.submit(
        [TaskSpec(queue="q", run_at=later, namespace="h", labels=(("team", "a"),))], later
    )
    found: list[str] = []
    token = ""
    for _ in range(100):
        page = await store_shape.list_tasks(
            "h", labels=(("team", "a"),), page_size=4, page_token=token
        )
        found += [t.id for t in page.tasks]
        if not (token := page.next_token):
            break
    assert sorted(found) == sorted([*moved, live.task.id])


async def test_without_retention_moved_tasks_are_kept_forever(
    store_shape: TaskStore, now: datetime
) -> None:
    (kept,) = await cancelled(store_shape, now, 1, idempotency_key="f")
    later = now + timedelta(seconds=1)
    upkeep = await store_shape.keep_history(later, retention=None, width=WIDTH)
    assert upkeep.created == 0
    done = await store_shape.retire_finished(
        ALL, later, later, retention=None, width=WIDTH, batch=10
    )
    assert (done.gone, done.kept) == (1, 1)
    far = now + timedelta(days=3650)
    assert (await store_shape.keep_history(far, retention=None, width=WIDTH)).dropped == 0
    assert (await store_shape.get(kept, "h")).state is TaskState.CANCELLED
    (again,) = await store_shape.submit(
        [TaskSpec(queue="q", run_at=far, namespace="h", idempotency_key="f")], far
    )
    assert again.task.id == kept and not again.created
