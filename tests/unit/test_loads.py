"""The published loads (pure): rounding, summing over buckets, and when to publish."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from chronoq.buckets import bucket_of, bucket_start
from chronoq.coordinator import ring
from chronoq.coordinator.loads import coming, due_loads, quantize, worth_publishing

instants = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)
widths = st.sampled_from([1, 5, 60, 300])


@given(st.floats(min_value=1, max_value=1e12))
def test_a_count_rounds_to_a_power_of_two_within_a_factor_of_root_two(n: float) -> None:
    q = quantize(n)
    assert math.log2(q).is_integer()
    assert n / 2**0.5 <= q * (1 + 1e-9) and q <= n * 2**0.5 * (1 + 1e-9)


def test_counts_are_summed_per_partition_and_empty_ones_dropped() -> None:
    assert due_loads({(1, 10): 3, (1, 11): 5, (2, 10): 0, (3, 12): 1}) == {1: 8.0, 3: 1.0}
    assert quantize(0.5) == 0.0


def test_loads_are_published_only_when_they_change_and_overload_or_go_cold() -> None:
    parts = range(4)
    even = {0: "a", 1: "a", 2: "b", 3: "b"}
    # The same loads again: nothing to publish.
    assert not worth_publishing({0: 64.0}, {0: 64.0}, even, parts, 2, 0.25)
    # A hot partition overloads its member under the current assignment.
    assert worth_publishing({0: 64.0}, {}, even, parts, 2, 0.25)
    # Loads spread evenly enough: the assignment stays.
    assert not worth_publishing({0: 1.0, 2: 1.0}, {}, even, parts, 2, 0.25)
    # Every hot partition went cold: the old loads must not keep moving partitions.
    assert worth_publishing({}, {0: 64.0}, even, parts, 2, 0.25)


@given(instants, widths, st.integers(min_value=1, max_value=10), st.floats(-1e4, 1e4))
def test_the_loads_weigh_no_task_that_is_already_due(
    now: datetime, width: int, horizon: int, offset: float
) -> None:
    window = coming(now, width, horizon)
    run_at = now + timedelta(seconds=offset)
    # An overdue task waiting to fire (a slow store's backlog) never counts, whatever bucket
    # it is in; a coming one counts while its bucket is within the horizon.
    if run_at <= now:
        assert not window.holds(run_at, width)
    else:
        assert window.holds(run_at, width) == (run_at < bucket_start(window.last + 1, width))


@given(instants, widths, st.integers(min_value=1, max_value=10))
def test_the_window_spans_the_horizon_from_the_current_bucket(
    now: datetime, width: int, horizon: int
) -> None:
    window = coming(now, width, horizon)
    assert window.first == bucket_of(now, width) and window.last - window.first + 1 == horizon
    assert window.after == now
    # The rest of the current bucket counts: a hot minute is spread before it comes due.
    later = now + timedelta(microseconds=1)
    assert window.holds(later, width) == (bucket_of(later, width) <= window.last)


def test_counts_drifting_by_a_power_of_two_move_no_partition() -> None:
    parts = range(6)
    halves = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}
    steady = dict.fromkeys(parts, 4.0)
    # Three of a's partitions count twice as many, one of b's half: a is 27 of 40, above the
    # 25 the ring fills a member to, within the 30 of twice its slack.
    drifted = {**steady, 0: 8.0, 1: 8.0, 2: 8.0, 3: 2.0}
    assert not worth_publishing(drifted, steady, halves, parts, 2, 0.25)
    # A hot bucket is far past it.
    assert worth_publishing({**steady, 0: 64.0}, steady, halves, parts, 2, 0.25)


@given(
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 4.0, 8.0]), min_size=64, max_size=64),
    st.integers(min_value=2, max_value=4),
    st.dictionaries(st.integers(0, 63), st.sampled_from([1.0, 16.0]), min_size=1),
)
def test_the_loads_an_assignment_was_made_for_move_nothing_again(
    counts: list[float], members: int, before: dict[int, float]
) -> None:
    fresh = {p: load for p, load in enumerate(counts) if load > 0}
    names = [f"m{i}" for i in range(members)]
    assignment = ring.assign(64, names, fresh)
    if fresh != before and fresh:
        assert not worth_publishing(fresh, before, assignment, range(64), members, 0.25)
