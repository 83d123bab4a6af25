"""Saturating time arithmetic: no stored value, however wrong, makes it raise."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from chronoq.saturating import (
    END_OF_TIME,
    LONGEST,
    MS,
    START_OF_TIME,
    clamp,
    ms_of,
    ms_to_delta,
    shifted,
)

bigint = st.integers(min_value=-(2**63), max_value=2**63 - 1)
deltas = st.timedeltas(min_value=timedelta(0), max_value=LONGEST)
any_delta = st.timedeltas()
instants = st.datetimes(timezones=st.just(UTC))


@given(bigint, deltas, deltas)
def test_ms_to_delta_stays_within_bounds(ms: int, a: timedelta, b: timedelta) -> None:
    low, high = min(a, b), max(a, b)
    d = ms_to_delta(ms, low, high)
    assert low <= d <= high


@given(st.integers(min_value=0, max_value=ms_of(LONGEST)))
def test_ms_to_delta_is_exact_inside_the_bounds(ms: int) -> None:
    assert ms_to_delta(ms) == ms * MS


def test_ms_to_delta_saturates_the_poison_values() -> None:
    assert ms_to_delta(2**63 - 1) == LONGEST
    assert ms_to_delta(-(2**63)) == timedelta(0)
    assert ms_to_delta(None) == timedelta(0)
    hour = timedelta(hours=1)
    assert ms_to_delta(0, timedelta(seconds=1), hour) == timedelta(seconds=1)
    assert ms_to_delta(2**62, timedelta(seconds=1), hour) == hour


@given(any_delta, any_delta, any_delta)
def test_clamp_never_leaves_the_bounds(value: timedelta, a: timedelta, b: timedelta) -> None:
    low, high = min(a, b), max(a, b)
    assert low <= clamp(value, low, high) <= high


@given(instants, any_delta)
def test_shifted_is_the_sum_or_the_end_of_time(at: datetime, delta: timedelta) -> None:
    out = shifted(at, delta)
    try:
        expected = at + delta
    except OverflowError:
        expected = END_OF_TIME if delta > timedelta(0) else START_OF_TIME
    assert out == expected
    assert START_OF_TIME <= out <= END_OF_TIME
