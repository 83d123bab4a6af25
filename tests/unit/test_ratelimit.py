from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from chronoq.ratelimit import Quotas, TokenBucket


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
