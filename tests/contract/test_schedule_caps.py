"""Contract: a namespace's schedule cap and quota count every schedule of the namespace,
wherever its (namespace, name) places it: deletes and pauses free their share, a refused
create takes nothing. (Creates racing each other: tests/integration/test_namespace_counts.py,
on two shards, where the counter makes the cap exact.)"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from chronoq.errors import AlreadyExists, NamespaceCapReached, ScheduleQuotaExceeded
from chronoq.models import ScheduleSpec
from chronoq.recurrence import Every
from tests.contract.conftest import ScheduleStore

pytestmark = pytest.mark.timeout(60)

TEN_S = timedelta(seconds=10)  # 0.1 tasks/s reserved each


def every_ten(name: str, now: datetime) -> ScheduleSpec:
    return ScheduleSpec(name=name, queue="s", rule=Every(TEN_S, now), namespace="capped")


async def test_the_cap_counts_every_schedule_and_a_refusal_takes_nothing(
    schedules: ScheduleStore, now: datetime
) -> None:
    names = [f"n{i}" for i in range(6)]  # over several partitions (shards, when there are)
    made = [await schedules.create(every_ten(n, now), now, cap=4) for n in names[:4]]
    assert len({m.partition for m in made}) > 1
    with pytest.raises(NamespaceCapReached):
        await schedules.create(every_ten(names[4], now), now, cap=4)
    await schedules.delete("capped", names[0], now)
    with pytest.raises(AlreadyExists):  # refused: its place is not kept
        await schedules.create(every_ten(names[1], now), now, cap=4)
    await schedules.create(every_ten(names[4], now), now, cap=4)
    with pytest.raises(NamespaceCapReached):
        await schedules.create(every_ten(names[5], now), now, cap=4)
    assert len(await schedules.list_page("capped")) == 4


async def test_the_quota_counts_active_schedules_only(
    schedules: ScheduleStore, now: datetime
) -> None:
    for name in ("a", "b"):
        await schedules.create(every_ten(name, now), now, quota=0.2)
    with pytest.raises(ScheduleQuotaExceeded):
        await schedules.create(every_ten("c", now), now, quota=0.2)
    await schedules.pause("capped", "a", now)
    await schedules.pause("capped", "a", now)  # paused already: frees nothing more
    await schedules.create(every_ten("c", now), now, quota=0.2)
    with pytest.raises(ScheduleQuotaExceeded):
        await schedules.create(every_ten("d", now), now, quota=0.2)
    with pytest.raises(ScheduleQuotaExceeded):
        await schedules.resume("capped", "a", now, quota=0.2)
    await schedules.delete("capped", "c", now)
    assert not (await schedules.resume("capped", "a", now, quota=0.2)).paused
    with pytest.raises(ScheduleQuotaExceeded):
        await schedules.create(every_ten("d", now), now, quota=0.2)
