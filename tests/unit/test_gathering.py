"""How long a busy owner gathers due tasks (pure): never longer than the gap, and then
exactly a statement's worth; the rate follows the last window."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.gathering import BUSY_BATCH, BUSY_GAP, DueRate, gather_for


@given(rate=st.floats(0, 1e6))
def test_gathering_waits_only_when_a_statement_fills_within_the_gap(rate: float) -> None:
    wait = gather_for(rate)
    assert 0 <= wait <= BUSY_GAP
    if wait:
        assert rate * wait == pytest.approx(BUSY_BATCH)  # exactly a statement's worth
    else:
        assert rate * BUSY_GAP < BUSY_BATCH  # too slow to fill one: each instant fires


def test_the_due_rate_follows_the_last_second() -> None:
    rate = DueRate(1.0)
    for i in range(100):  # 1,000 a second for a second
        rate.add(10, i / 100)
    assert rate.per_second(1.0) == pytest.approx(1000 * (1 - math.exp(-1)), rel=0.05)
    assert rate.per_second(6.0) < 10  # five quiet seconds later: nearly nothing
    rate.add(5, 3.0)  # an event from before the last reading does not undo the decay
    assert rate.per_second(6.0) < 15
