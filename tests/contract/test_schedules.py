"""Contract: schedules (create, get, list, pause, resume, delete) and their materialisation
into tasks by the owner of the schedule's partition, fenced like every owner write."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from chronoq.errors import AlreadyExists, NamespaceCapReached, ScheduleNotFound
from chronoq.models import ScheduleSpec, Task, TaskState
from chronoq.recurrence import CatchUp, Cron, Every
from chronoq.store.port import TaskStore
from tests.contract.conftest import PARTITIONS, ScheduleStore

pytestmark = pytest.mark.timeout(60)

TEN_S = timedelta(seconds=10)


def every_ten(name: str, now: datetime, namespace: str = "default") -> ScheduleSpec:
    return ScheduleSpec(
        name=name, queue="s", rule=Every(TEN_S, now), namespace=namespace, payload=b"tick"
    )


async def owned(store: TaskStore, token: int, owner: str) -> dict[int, int]:
    out = {}
    for p in range(PARTITIONS):
        assert await store.take_fence(p, token, "contract", owner) is not None
        out[p] = token
    return out


async def queue_tasks(store: TaskStore, namespace: str = "default") -> list[Task]:
    page = await store.list_tasks(namespace, queue="s", page_size=1000)
    assert page.next_token == ""
    return page.tasks


async def test_create_get_list_and_delete(
    store_shape: TaskStore, schedules: ScheduleStore, now: datetime
) -> None:
    made = await schedules.create(every_ten("b", now), now)
    assert made.spec.name == "b" and not made.paused and made.next_fire_at == now
    assert 0 <= made.partition < PARTITIONS
    await schedules.create(every_ten("a", now), now)
    await schedules.create(
        ScheduleSpec(name="c", queue="s", rule=Cron("*/5 * * * *"), namespace="default"), now
    )
    await schedules.create(every_ten("b", now, namespace="other"), now)  # names per namespace
    with pytest.raises(AlreadyExists):
        await schedules.create(every_ten("b", now), now)
    assert await schedules.get("default", "b") == made
    assert [s.spec.name for s in await schedules.list_page("default")] == ["a", "b", "c"]
    assert [s.spec.name for s in await schedules.list_page("other")] == ["b"]

    await schedules.delete("default", "b", now)
    with pytest.raises(ScheduleNotFound):
        await schedules.get("default", "b")
    with pytest.raises(ScheduleNotFound):
        await schedules.delete("default", "b", now)
    assert [s.spec.name for s in await schedules.list_page("default")] == ["a", "c"]
    assert (await schedules.get("other", "b")).spec.namespace == "other"


async def test_list_pages_by_name(schedules: ScheduleStore, now: datetime) -> None:
    names = [f"s{i:02d}" for i in range(25)]
    for name in reversed(names):
        await schedules.create(every_ten(name, now), now)
    seen: list[str] = []
    after = ""
    for _ in range(10):  # bounded
        page = await schedules.list_page("default", page_size=10, after=after)
        if not page:
            break
        seen += [s.spec.name for s in page]
        after = page[-1].spec.name
    assert seen == names


async def test_a_namespace_holds_at_most_its_cap(schedules: ScheduleStore, now: datetime) -> None:
    await schedules.create(every_ten("one", now), now, cap=1)
    with pytest.raises(NamespaceCapReached):
        await schedules.create(every_ten("two", now), now, cap=1)
    await schedules.create(every_ten("two", now, namespace="other"), now, cap=1)


async def test_the_owner_materialises_each_occurrence_once(
    store_shape: TaskStore, schedules: ScheduleStore, now: datetime
) -> None:
    made = await schedules.create(every_ten("m", now), now)
    others = {p: 1 for p in range(PARTITIONS) if p != made.partition}
    for p in others:
        assert await store_shape.take_fence(p, 1, "contract", "elsewhere") is not None
    # The owner of other partitions makes nothing of it.
    assert (await schedules.materialize(others, now)).created == 0

    mine = {made.partition: 1}
    assert await store_shape.take_fence(made.partition, 1, "contract", "me") is not None
    first = await schedules.materialize(mine, now, lookahead=timedelta(seconds=60))
    assert first.created == 7  # now, +10 s, ..., +60 s
    tasks = await queue_tasks(store_shape)
    assert sorted(t.run_at for t in tasks) == [now + TEN_S * i for i in range(7)]
    assert all(t.payload == b"tick" for t in tasks)
    assert {t.state for t in tasks if t.run_at > now} == {TaskState.SCHEDULED}
    # Again at the same instant, and after a takeover: nothing is made twice.
    assert (await schedules.materialize(mine, now)).created == 0
    new = await owned(store_shape, 2, "new")
    assert (await schedules.materialize(new, now)).created == 0
    later = now + timedelta(seconds=30)
    assert (await schedules.materialize(mine, later)).created == 0  # fenced: stale token
    assert (await schedules.materialize(new, later)).created == 3  # +70, +80, +90 s
    assert len(await queue_tasks(store_shape)) == 10
    after = await schedules.get("default", "m")
    assert after.created_total == 10 and after.next_fire_at == now + TEN_S * 10


async def test_pause_removes_what_has_not_fired_and_resume_goes_forward(
    store_shape: TaskStore, schedules: ScheduleStore, now: datetime
) -> None:
    await schedules.create(every_ten("p", now), now)
    owner = await owned(store_shape, 1, "me")
    assert (await schedules.materialize(owner, now)).created == 7
    paused = await schedules.pause("default", "p", now)
    assert paused.paused
    # The occurrence due at ``now`` went READY when made: it stays; the six waiting are gone.
    left = await queue_tasks(store_shape)
    assert [t.run_at for t in left] == [now] and left[0].state is TaskState.READY
    later = now + timedelta(minutes=5)
    assert (await schedules.materialize(owner, later)).created == 0  # paused: nothing
    resumed = await schedules.resume("default", "p", later)
    assert not resumed.paused and resumed.next_fire_at > later  # paused time not caught up
    made = await schedules.materialize(owner, later)
    assert made.created == 6  # later + 10 s ... + 60 s
    assert min(t.run_at for t in await queue_tasks(store_shape) if t.run_at > now) > later

    await schedules.delete("default", "p", later)
    assert [t.run_at for t in await queue_tasks(store_shape)] == [now]


@pytest.mark.parametrize(
    ("policy", "missed_made", "skipped"),
    [(CatchUp.ALL, 6, 0), (CatchUp.LATEST, 1, 5), (CatchUp.NONE, 0, 6)],
    ids=["all", "latest", "none"],
)
async def test_a_late_owner_catches_up_as_the_schedule_says(
    store_shape: TaskStore,
    schedules: ScheduleStore,
    now: datetime,
    policy: CatchUp,
    missed_made: int,
    skipped: int,
) -> None:
    """No owner for a minute: the six missed occurrences are all made, the latest only, or
    none, as the schedule's catch-up policy says; the ones ahead are made in every case."""
    await schedules.create(
        ScheduleSpec(name="c", queue="s", rule=Every(TEN_S, now), catch_up=policy), now
    )
    owner = await owned(store_shape, 1, "me")
    late = now + timedelta(seconds=60)
    made = await schedules.materialize(owner, late, lookahead=timedelta(seconds=30))
    ahead = 4  # late, +10 s, +20 s, +30 s
    assert (made.created, made.skipped) == (missed_made + ahead, skipped)
    tasks = await queue_tasks(store_shape)
    assert len([t for t in tasks if t.run_at < late]) == missed_made
    assert len({t.run_at for t in tasks}) == len(tasks)
