"""The tick's cadence beside a timing wheel, with a fake store (the statements themselves run
against PostgreSQL in tests/integration/test_precise_firing.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from chronoq.clock import ManualClock
from chronoq.errors import StoreUnavailable
from chronoq.node.owner.firing import Firer
from chronoq.store import FireResult, Store

TICK, CATCH_ALL = 0.1, 5.0


class FakeStore:
    bucket_seconds = 60

    def __init__(self) -> None:
        self.next: FireResult | Exception = FireResult()

    async def fire_due(self, owned: Mapping[int, int], now: datetime, **_: Any) -> FireResult:
        if isinstance(self.next, Exception):
            raise self.next
        return self.next

    async def advance_watermarks(self, owned: Mapping[int, int], bucket: int) -> set[int]:
        return set(owned)


class FakeOwnership:
    def __init__(self) -> None:
        self.gate = asyncio.Lock()

    def owned(self) -> Mapping[int, int]:
        return {0: 1}


def _firer(store: FakeStore, catch_all: float | None = CATCH_ALL) -> Firer:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    return Firer(
        cast(Store, store),
        cast(Any, FakeOwnership()),
        clock,
        tick=TICK,
        batch=10,
        rounds=1,
        catch_all=catch_all,
    )


async def test_quiet_ticks_slow_to_the_catch_all_and_a_late_task_brings_them_back() -> None:
    store = FakeStore()
    firer = _firer(store)
    assert firer._interval() == TICK  # nothing known yet
    await firer.tick()
    assert firer._interval() == CATCH_ALL
    store.next = FireResult(fired=1, lateness=[TICK / 2])  # fired at the wheel's instant
    await firer.tick()
    assert firer._interval() == CATCH_ALL
    store.next = FireResult(fired=1, lateness=[2 * TICK])  # the wheel did not hold it
    await firer.tick()
    assert firer._interval() == TICK


async def test_a_failed_tick_is_retried_at_the_tick_not_the_catch_all() -> None:
    store = FakeStore()
    firer = _firer(store)
    await firer.tick()
    assert firer._interval() == CATCH_ALL
    store.next = StoreUnavailable("down")
    with pytest.raises(StoreUnavailable):
        await firer.tick()
    assert firer._interval() == TICK


async def test_without_a_wheel_every_tick_runs() -> None:
    firer = _firer(FakeStore(), catch_all=None)
    await firer.tick()
    assert firer._interval() == TICK
