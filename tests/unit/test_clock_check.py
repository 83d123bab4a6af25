"""The clock check's decisions, pure: a reading bounds the true offset, and the node is
called skewed only when it certainly is, and back in bound only when it certainly is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from chronoq.clock import ManualClock, OffsetClock, SystemClock
from chronoq.node.clock_check import OffsetSample, best, follows_wall_clock, is_skewed, sample

T0 = datetime(2030, 1, 1, tzinfo=UTC)
BOUND = timedelta(milliseconds=500)
ms = st.integers(min_value=-10_000, max_value=10_000).map(lambda n: timedelta(milliseconds=n))
trips = st.integers(min_value=0, max_value=2_000).map(lambda n: timedelta(milliseconds=n))


def reading(true_offset: timedelta, trip: timedelta, at: float) -> OffsetSample:
    """The reference clock (ours + ``true_offset``) read at fraction ``at`` of the trip."""
    return sample(T0, T0 + true_offset + trip * at, trip)


def test_a_reading_in_the_middle_of_the_trip_is_exact() -> None:
    r = reading(timedelta(seconds=-3), timedelta(milliseconds=40), 0.5)
    assert r == OffsetSample(timedelta(seconds=-3), timedelta(milliseconds=20))


@given(ms, trips, st.floats(min_value=0, max_value=1))
def test_the_true_offset_is_within_the_uncertainty(
    true_offset: timedelta, trip: timedelta, at: float
) -> None:
    r = reading(true_offset, trip, at)
    assert abs(r.offset - true_offset) <= r.uncertainty + timedelta(microseconds=1)


@given(ms, trips, st.floats(min_value=0, max_value=1), st.booleans())
def test_the_state_changes_only_when_the_reading_is_certain(
    true_offset: timedelta, trip: timedelta, at: float, was: bool
) -> None:
    """Never suspended while the true offset is within the bound, never resumed while it is
    beyond: a change of state always agrees with the truth."""
    decided = is_skewed(reading(true_offset, trip, at), BOUND, was_skewed=was)
    if decided != was and abs(abs(true_offset) - BOUND) > timedelta(microseconds=1):
        assert decided == (abs(true_offset) > BOUND)


def test_decisions_at_the_edges_keep_the_state() -> None:
    far = OffsetSample(timedelta(seconds=3), timedelta(milliseconds=10))
    near = OffsetSample(timedelta(milliseconds=-20), timedelta(milliseconds=10))
    unsure = OffsetSample(timedelta(milliseconds=600), timedelta(milliseconds=200))
    assert is_skewed(far, BOUND, was_skewed=False)
    assert not is_skewed(near, BOUND, was_skewed=True)
    assert is_skewed(unsure, BOUND, was_skewed=True)
    assert not is_skewed(unsure, BOUND, was_skewed=False)


def test_the_tightest_reading_wins() -> None:
    readings = [
        OffsetSample(timedelta(seconds=1), timedelta(milliseconds=30)),
        OffsetSample(timedelta(seconds=2), timedelta(milliseconds=2)),
        OffsetSample(timedelta(seconds=3), timedelta(milliseconds=9)),
    ]
    assert best(readings).offset == timedelta(seconds=2)


def test_only_wall_clocks_are_checked() -> None:
    assert follows_wall_clock(SystemClock())
    assert follows_wall_clock(OffsetClock(timedelta(seconds=3)))
    assert not follows_wall_clock(ManualClock(T0))
