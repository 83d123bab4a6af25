"""Poison isolation: halving a failed batch finds exactly the rows that fail alone."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoq.errors import StoreUnavailable
from chronoq.store.quarantine import MAX_REASON, QUARANTINED, isolate, reason


class FakeBatch:
    """A statement over items that fails with a data error when any bad item is in it."""

    def __init__(self, bad: set[int], error: BaseException) -> None:
        self.bad = bad
        self.error = error
        self.done: list[int] = []
        self.poisoned: list[int] = []
        self.tries = 0

    async def attempt(self, items: Sequence[int]) -> None:
        self.tries += 1
        if self.bad & set(items):
            raise self.error
        self.done.extend(items)

    async def poison(self, item: int, exc: BaseException) -> None:
        assert exc is self.error
        self.poisoned.append(item)


@settings(max_examples=200)
@given(st.integers(min_value=0, max_value=300), st.data())
async def test_isolate_processes_every_good_item_once_and_sets_aside_the_bad(
    n: int, data: st.DataObject
) -> None:
    bad = data.draw(st.sets(st.integers(min_value=0, max_value=max(0, n - 1)), max_size=5))
    bad &= set(range(n))
    error = data.draw(
        st.sampled_from(
            [
                asyncpg.exceptions.DatetimeFieldOverflowError("interval out of range"),
                OverflowError("date value out of range"),
                ValueError("9 is not a valid TaskState"),
            ]
        )
    )
    batch = FakeBatch(bad, error)
    await isolate(list(range(n)), batch.attempt, batch.poison)
    assert sorted(batch.done) == sorted(set(range(n)) - bad)
    assert len(batch.done) == len(set(batch.done))
    assert sorted(batch.poisoned) == sorted(bad)
    if len(bad) == 1:  # one bad row costs about 2 log2(n) extra tries, not n
        assert batch.tries <= 2 * max(1, n).bit_length() + 1


async def test_isolate_lets_an_outage_through() -> None:
    """A lost connection is not a poisoned row: nothing is quarantined, the pass fails."""
    batch = FakeBatch({1}, StoreUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        await isolate([0, 1, 2], batch.attempt, batch.poison)
    assert batch.poisoned == []


def test_reason_is_bounded_and_storable() -> None:
    why = reason(ValueError("x\x00" * 1000))
    assert why.startswith(QUARANTINED) and "\x00" not in why and len(why) <= MAX_REASON
    assert reason("bad cron") == "quarantined: bad cron"
