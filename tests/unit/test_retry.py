from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.retry import attempts_left, backoff, retry_time, stored_backoff

ms = st.integers(min_value=0, max_value=10_000_000).map(lambda v: timedelta(milliseconds=v))


@given(st.integers(min_value=1, max_value=200), ms, ms, st.integers(min_value=0, max_value=2**32))
def test_backoff_is_capped_and_at_least_half(
    attempt: int, a: timedelta, b: timedelta, seed: int
) -> None:
    initial, maximum = min(a, b), max(a, b)
    d = backoff(attempt, initial=initial, maximum=maximum, rng=random.Random(seed))
    exp = min(initial.total_seconds() * 2.0 ** (attempt - 1), maximum.total_seconds())
    assert exp / 2 - 1e-6 <= d.total_seconds() <= exp + 1e-6


def test_backoff_grows_exponentially_without_jitter() -> None:
    delays = [
        backoff(n, initial=timedelta(seconds=1), maximum=timedelta(minutes=1), jitter=0.0)
        for n in range(1, 9)
    ]
    assert [d.total_seconds() for d in delays] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_backoff_is_reproducible_from_a_seed() -> None:
    one = backoff(3, initial=timedelta(seconds=1), maximum=timedelta(hours=1), rng=random.Random(7))
    two = backoff(3, initial=timedelta(seconds=1), maximum=timedelta(hours=1), rng=random.Random(7))
    assert one == two


def test_backoff_refuses_bad_input() -> None:
    with pytest.raises(ValueError):
        backoff(0, initial=timedelta(seconds=1), maximum=timedelta(seconds=2))
    with pytest.raises(ValueError):
        backoff(1, initial=timedelta(seconds=1), maximum=timedelta(seconds=2), jitter=2)


@given(st.integers(0, 100), st.integers(1, 100), st.integers(0, 100))
def test_attempts_left_counts_from_the_retry_base(
    attempt: int, max_attempts: int, base: int
) -> None:
    assert attempts_left(attempt, max_attempts, base) == (attempt - base < max_attempts)


bigint = st.integers(min_value=-(2**63), max_value=2**63 - 1)
horizons = st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3660))


@given(bigint, bigint, bigint, horizons, st.integers(min_value=0, max_value=2**32))
def test_stored_backoff_never_raises_and_stays_within_the_horizon(
    attempts: int, initial_ms: int, max_ms: int, horizon: timedelta, seed: int
) -> None:
    """Any row, however written (negative, zero, 2**63 - 1 ms), gets a delay in range."""
    d = stored_backoff(attempts, initial_ms, max_ms, horizon=horizon, rng=random.Random(seed))
    assert timedelta(0) <= d <= horizon


@given(
    st.integers(min_value=1, max_value=50),
    st.integers(min_value=0, max_value=10_000_000),
    st.integers(min_value=0, max_value=10_000_000),
    st.integers(min_value=0, max_value=2**32),
)
def test_stored_backoff_matches_backoff_for_values_in_range(
    attempt: int, a: int, b: int, seed: int
) -> None:
    initial, maximum = timedelta(milliseconds=min(a, b)), timedelta(milliseconds=max(a, b))
    horizon = timedelta(days=366)
    stored = stored_backoff(attempt, min(a, b), max(a, b), horizon=horizon, rng=random.Random(seed))
    plain = backoff(attempt, initial=initial, maximum=maximum, rng=random.Random(seed))
    assert stored == plain


@given(st.datetimes(timezones=st.just(UTC)), st.timedeltas(), horizons)
def test_retry_time_is_never_before_now_nor_past_the_horizon(
    now: datetime, delay: timedelta, horizon: timedelta
) -> None:
    at = retry_time(now, delay, horizon=horizon)
    assert now <= at
    assert at - now <= horizon


def test_a_huge_backoff_retries_a_horizon_from_now_instead_of_overflowing() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    horizon = timedelta(days=366)
    delay = stored_backoff(3, 2**63 - 1, 2**63 - 1, horizon=horizon, rng=random.Random(1))
    assert horizon / 2 <= delay <= horizon
    assert retry_time(now, delay, horizon=horizon) == now + delay
    end = datetime(9999, 12, 31, tzinfo=UTC)
    assert retry_time(end, horizon, horizon=horizon) == datetime.max.replace(tzinfo=UTC)
