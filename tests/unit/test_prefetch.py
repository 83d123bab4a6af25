"""How many tasks a worker holds beyond its slots: bounded, and none for slow handlers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronoq.client.prefetch import PREFETCH_HORIZON, HandlerPace, prefetch_limit

durations = st.floats(min_value=0, max_value=3600, allow_nan=False)


@given(prefetch=st.integers(0, 10_000), concurrency=st.integers(1, 10_000), mean=durations)
def test_never_more_than_asked_nor_less_than_none(prefetch: int, concurrency: int, mean: float) -> None:
    assert 0 <= prefetch_limit(prefetch, concurrency, mean) <= prefetch


@given(
    prefetch=st.integers(0, 10_000),
    concurrency=st.integers(1, 10_000),
    a=durations,
    b=durations,
)
def test_slower_handlers_never_get_more(prefetch: int, concurrency: int, a: float, b: float) -> None:
    quick, slow = sorted((a, b))
    assert prefetch_limit(prefetch, concurrency, slow) <= prefetch_limit(prefetch, concurrency, quick)


@given(prefetch=st.integers(1, 10_000), concurrency=st.integers(1, 10_000), mean=durations)
def test_what_is_held_starts_within_the_horizon(prefetch: int, concurrency: int, mean: float) -> None:
    held = prefetch_limit(prefetch, concurrency, mean)
    # ``held`` tasks behind ``concurrency`` slots each freeing every ``mean`` seconds.
    assert held * mean / concurrency <= PREFETCH_HORIZON + 1e-9


def test_nothing_is_held_before_a_pace_is_known_or_when_asked_for_none() -> None:
    assert prefetch_limit(80, 20, None) == 0
    assert prefetch_limit(0, 20, 0.0) == 0
    assert prefetch_limit(80, 20, float("nan")) == 0


def test_quick_handlers_get_all_slow_ones_none() -> None:
    assert prefetch_limit(80, 20, 0.0001) == 80  # 0.1 ms: 4,000 would fit in 20 ms
    assert prefetch_limit(80, 20, 0.01) == 40  # 10 ms: 20 slots start 40 in 20 ms
    assert prefetch_limit(80, 20, 1.0) == 0  # a second each: nothing waits behind them


@given(st.lists(durations, min_size=1, max_size=50))
def test_the_running_mean_stays_within_what_it_saw(seen: list[float]) -> None:
    pace = HandlerPace()
    for seconds in seen:
        pace.add(seconds)
    assert pace.mean is not None
    assert min(seen) - 1e-9 <= pace.mean <= max(seen) + 1e-9


def test_the_running_mean_follows_a_change_of_pace() -> None:
    pace = HandlerPace()
    for _ in range(100):
        pace.add(0.001)
    for _ in range(50):
        pace.add(2.0)
    assert pace.mean is not None and pace.mean > 1.9
