"""The one percentile definition: nearest rank, always a sample, monotone in p."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.stats import percentile, rank

samples = st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=200)
ps = st.floats(min_value=0, max_value=100)


def test_known_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([], 50) is None
    assert percentile([timedelta(seconds=3), timedelta(seconds=1)], 50) == timedelta(seconds=1)


def test_out_of_range() -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match="no samples"):
        rank(0, 50)


@given(samples, ps)
def test_is_a_sample(values: list[float], p: float) -> None:
    assert percentile(values, p) in values


@given(samples, ps)
def test_nearest_rank_definition(values: list[float], p: float) -> None:
    """At least p% of the samples are <= the result, which sits at the nearest rank."""
    ordered = sorted(values)
    result = percentile(values, p)
    assert result is not None
    at_or_below = sum(1 for v in ordered if v <= result)
    assert at_or_below >= math.floor(p / 100 * len(ordered))
    assert ordered[rank(len(ordered), p) - 1] == result


@given(samples, ps, ps)
def test_monotone_in_p(values: list[float], p: float, q: float) -> None:
    low, high = sorted((p, q))
    first, second = percentile(values, low), percentile(values, high)
    assert first is not None and second is not None
    assert first <= second


@given(samples, ps)
def test_order_does_not_matter(values: list[float], p: float) -> None:
    assert percentile(values, p) == percentile(list(reversed(values)), p)


@given(st.integers(min_value=1, max_value=10_000), ps)
def test_rank_bounds(count: int, p: float) -> None:
    assert 1 <= rank(count, p) <= count
