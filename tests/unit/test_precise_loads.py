"""The wheel's loads and hand-offs, with a fake store that records what it was asked (the
statements themselves are tested against PostgreSQL in tests/integration)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from chronoq.buckets import partition_of
from chronoq.clock import ManualClock
from chronoq.gathering import BUSY_GAP, gather_for
from chronoq.node.owner.firing import Firer
from chronoq.node.owner.precise import PreciseFirer, instant_of
from chronoq.partitionmap import PartitionMap
from chronoq.store import FireResult, Store
from chronoq.wheel import Due

START = datetime(2030, 1, 1, 12, 0, 10, tzinfo=UTC)
PARTITIONS = 8
KEY = ("default", "q")


class FakeStore:
    partitions = PARTITIONS

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, datetime]] = []  # (id, partition, run_at)
        self.windows: list[tuple[tuple[int, ...], datetime, datetime]] = []

    async def due_soon(
        self, partitions: Sequence[int], after: datetime, until: datetime, *, limit: int
    ) -> list[tuple[str, int, datetime, str, str]]:
        self.windows.append((tuple(partitions), after, until))
        got = [r for r in self.rows if r[1] in partitions and after < r[2] <= until]
        return [(*r, "default", "q") for r in sorted(got, key=lambda r: r[2])[:limit]]

    async def fire_listed(
        self,
        owned: Mapping[int, int],
        now: datetime,
        ids: Sequence[str],
        *,
        node_id: str = "",
        leases: Mapping[str, str] | None = None,
        budgets: Mapping[str, tuple[int, int]] | None = None,
    ) -> FireResult:
        return FireResult(fired=len(ids))


class FakeOwnership:
    def __init__(self, owned: dict[int, int]) -> None:
        self.gate = asyncio.Lock()
        self.mine = owned

    def owned(self) -> Mapping[int, int]:
        return dict(self.mine)


def _precise(store: FakeStore, ownership: FakeOwnership, clock: ManualClock) -> PreciseFirer:
    firer = Firer(cast(Store, store), cast(Any, ownership), clock, tick=60, batch=10, rounds=1)
    return PreciseFirer(
        cast(Store, store),
        cast(Any, ownership),
        clock,
        firer.account,
        partitions=PartitionMap(PARTITIONS),
        horizon=timedelta(seconds=2),
        capacity=100,
    )


def _task(partition: int) -> str:
    while True:
        task_id = str(uuid.uuid4())
        if partition_of(uuid.UUID(task_id).bytes, PARTITIONS) == partition:
            return task_id


async def test_loads_read_each_window_once_and_start_over_after_a_jump() -> None:
    store, clock = FakeStore(), ManualClock(START)
    precise = _precise(store, FakeOwnership({0: 1, 1: 1}), clock)
    await precise.load()
    assert store.windows[-1][1:] == (START, START + timedelta(seconds=2))
    clock.advance(timedelta(milliseconds=500))
    await precise.load()  # only past the end of the previous window
    assert store.windows[-1][1:] == (START + timedelta(seconds=2), START + timedelta(seconds=2.5))
    clock.advance(timedelta(seconds=-30))  # the clock jumped back: the whole window again
    await precise.load()
    now = clock.now()
    assert store.windows[-1][1:] == (now, now + timedelta(seconds=2))


async def test_a_full_wheel_reads_the_rest_of_the_window_later() -> None:
    store, clock = FakeStore(), ManualClock(START)
    at = START + timedelta(seconds=1)
    store.rows = [(f"t{i}", 0, at) for i in range(150)]  # 150 at one instant, room for 100
    precise = _precise(store, FakeOwnership({0: 1}), clock)
    assert await precise.load() == 100
    fired = {d.task_id for d in precise.wheel.pop_due(instant_of(at))}  # room again
    store.rows = [r for r in store.rows if r[0] not in fired]  # no longer SCHEDULED
    assert await precise.load() == 50  # the same instant read again: the rest enters
    assert store.windows[-1][1] < at


async def test_ownership_moves_drop_entries_and_read_the_new_partitions() -> None:
    store, clock = FakeStore(), ManualClock(START)
    ownership = FakeOwnership({0: 1, 1: 1})
    precise = _precise(store, ownership, clock)
    soon = START + timedelta(seconds=1)
    store.rows = [("a", 0, soon), ("b", 1, soon), ("c", 2, soon)]
    await precise.load()
    assert precise.wheel.partitions() == {0, 1}
    ownership.mine = {0: 1, 2: 5}  # 1 lost, 2 taken
    precise.forget({1, 2})
    assert precise.wheel.partitions() == {0}
    clock.advance(timedelta(milliseconds=100))
    await precise.load()
    assert precise.wheel.partitions() == {0, 2}  # the taken partition read over the window
    assert any(w[0] == (2,) for w in store.windows)


async def test_submits_enter_here_or_go_to_their_owner() -> None:
    store, clock = FakeStore(), ManualClock(START)
    precise = _precise(store, FakeOwnership({3: 1}), clock)
    mine, theirs, later = _task(3), _task(4), _task(3)
    soon = START + timedelta(seconds=1)
    others = precise.offer(
        [
            (mine, soon, KEY),
            (theirs, soon, KEY),
            (later, START + timedelta(seconds=30), KEY),
        ],
        START,
    )
    assert mine in precise.wheel and later not in precise.wheel  # beyond the horizon
    assert others == [Due(theirs, 4, instant_of(soon))]  # id, partition, instant: no key
    precise.told([Due("x", 3, 1), Due("y", 4, 1)], None)  # None: read every partition again
    assert "x" in precise.wheel and "y" not in precise.wheel


async def test_a_busy_owner_gathers_due_tasks_so_statements_carry_more() -> None:
    store, clock = FakeStore(), ManualClock(START)
    owned = {p: 1 for p in range(PARTITIONS)}
    precise = _precise(store, FakeOwnership(owned), clock)
    precise.wheel.add(_task(0), 0, instant_of(START))
    await precise.fire()
    precise.wheel.add(_task(1), 1, instant_of(START))  # due already: fire at once
    assert precise._fire_interval() < 0.001
    precise._rate.add(1_500, time.monotonic())  # as in a second at 1,500 a second: gather
    for i in range(40):
        precise.wheel.add(_task(i % PARTITIONS), i % PARTITIONS, instant_of(START))
    await precise.fire()
    precise.wheel.add(_task(1), 1, instant_of(START))
    gather = gather_for(precise._rate.per_second(time.monotonic()))
    assert 0 < gather <= BUSY_GAP
    assert precise._fire_interval() >= 0.99 * gather  # the rate decays a little meanwhile
    # never sooner than the next instant either
    precise.wheel.pop_due(instant_of(START))
    precise.wheel.add(_task(2), 2, instant_of(START + timedelta(milliseconds=200)))
    assert precise._fire_interval() == pytest.approx(0.2, abs=0.05)
