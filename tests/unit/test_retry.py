from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.models import TaskState
from chronoq.retry import after_failure, attempts_left, backoff, retry_time, stored_backoff

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


instants = st.datetimes(timezones=st.just(UTC))
small = st.integers(min_value=-5, max_value=200)


@given(
    small, small, small, bigint, bigint, instants, horizons, st.booleans(), st.integers(0, 2**32)
)
def test_after_failure_never_raises_and_waits_within_the_horizon(
    attempt: int,
    max_attempts: int,
    retry_base: int,
    initial_ms: int,
    max_ms: int,
    now: datetime,
    horizon: timedelta,
    fatal: bool,
    seed: int,
) -> None:
    """Whatever a stored row holds, a failed attempt goes DEAD now (fatal, or out of
    attempts) or waits at most a horizon: READY exactly when its retry time has come."""
    state, run_at = after_failure(
        attempt=attempt,
        max_attempts=max_attempts,
        retry_base=retry_base,
        backoff_initial_ms=initial_ms,
        backoff_max_ms=max_ms,
        now=now,
        horizon=horizon,
        fatal=fatal,
        rng=random.Random(seed),
    )
    if fatal or not attempts_left(attempt, max_attempts, retry_base):
        assert (state, run_at) == (TaskState.DEAD, now)
        return
    assert now <= run_at
    assert run_at - now <= horizon
    assert state is (TaskState.READY if run_at <= now else TaskState.SCHEDULED)


@given(small, st.integers(1, 200), instants, st.timedeltas(), horizons)
def test_after_failure_waits_retry_after_instead_of_the_backoff(
    attempt: int, max_attempts: int, now: datetime, retry_after: timedelta, horizon: timedelta
) -> None:
    state, run_at = after_failure(
        attempt=attempt,
        max_attempts=max_attempts + attempt,  # attempts left
        retry_base=0,
        backoff_initial_ms=1000,
        backoff_max_ms=60_000,
        now=now,
        horizon=horizon,
        retry_after=retry_after,
    )
    assert run_at == retry_time(now, retry_after, horizon=horizon)
    assert state is not TaskState.DEAD


def test_after_failure_backs_off_from_the_attempts_since_the_retry_base() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    common = {
        "max_attempts": 10,
        "backoff_initial_ms": 1000,
        "backoff_max_ms": 3_600_000,
        "now": now,
        "horizon": timedelta(days=1),
    }
    # Third attempt since a requeue at attempt 5: 4 s of backoff, halved at most by jitter.
    state, run_at = after_failure(attempt=8, retry_base=5, rng=random.Random(3), **common)
    assert state is TaskState.SCHEDULED
    assert timedelta(seconds=2) <= run_at - now <= timedelta(seconds=4)
    assert after_failure(attempt=15, retry_base=5, **common) == (TaskState.DEAD, now)
