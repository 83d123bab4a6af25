from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from chronoq.ratelimit import Quotas, TokenBucket, schedule_rate
from chronoq.recurrence import Cron, Every


def test_bucket_refills_at_its_rate_up_to_the_burst() -> None:
    b = TokenBucket(rate=10, burst=5)
    assert b.take(5, now=0.0) and not b.take(1, now=0.0)
    assert not b.take(2, now=0.1)  # 1 token back after 100 ms
    assert b.take(1, now=0.1)
    assert b.take(5, now=100.0) and not b.take(1, now=100.0)  # never more than the burst


def test_wait_time_says_when_to_come_back() -> None:
    b = TokenBucket(rate=2, burst=4)
    b.take(4, now=0.0)
    assert math.isclose(b.wait_time(3, now=0.0), 1.5)
    assert b.wait_time(5, now=0.0) == float("inf")


@given(st.lists(st.tuples(st.floats(0, 10), st.integers(1, 5)), max_size=200))
def test_never_grants_more_than_rate_times_time_plus_burst(calls: list[tuple[float, int]]) -> None:
    rate, burst = 3.0, 4.0
    b = TokenBucket(rate=rate, burst=burst)
    now = 0.0
    granted = 0
    for dt, n in calls:
        now += dt
        if b.take(n, now):
            granted += n
    assert granted <= burst + rate * now + 1e-9


def test_quotas_are_per_key() -> None:
    q = Quotas(rate=1, burst=2)
    assert q.take("a", 2, now=0.0) is None
    assert q.take("a", 1, now=0.0) == 1.0
    assert q.take("b", 2, now=0.0) is None


def test_a_schedule_reserves_its_most_tasks_per_second() -> None:
    anchor = datetime(2030, 1, 1, tzinfo=UTC)
    assert schedule_rate(Every(timedelta(seconds=1), anchor)) == 1.0
    assert schedule_rate(Every(timedelta(minutes=5), anchor)) == 1 / 300
    # Cron's finest unit is the minute, whatever the expression: the most it can make.
    assert schedule_rate(Cron("* * * * *")) == 1 / 60
    assert schedule_rate(Cron("0 3 * * 1", "Europe/Paris")) == 1 / 60


@given(st.integers(1, 10**9))
def test_two_schedules_at_half_the_interval_reserve_one_at_the_interval(ms: int) -> None:
    anchor = datetime(2030, 1, 1, tzinfo=UTC)
    one = schedule_rate(Every(timedelta(milliseconds=2 * ms), anchor))
    assert math.isclose(2 * one, schedule_rate(Every(timedelta(milliseconds=ms), anchor)))


def test_available_counts_whole_tokens_and_refills() -> None:
    from chronoq.ratelimit import Quotas

    quotas = Quotas(rate=10, burst=10)
    assert quotas.available("ns", 0.0) == 10  # a new namespace: the full burst
    assert quotas.take("ns", 10, 0.0) is None
    assert quotas.available("ns", 0.0) == 0
    assert quotas.available("ns", 0.25) == 2  # 2.5 tokens: two whole occurrences
