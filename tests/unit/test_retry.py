from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.retry import attempts_left, backoff

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
