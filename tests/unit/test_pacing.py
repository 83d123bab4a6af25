"""The client-side pacer: asyncio-throttle set up for a rate, fractional rates included."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.client.pacing import pacer
from chronoq.errors import ConfigError


@given(rate=st.floats(min_value=0.001, max_value=1e6), per=st.integers(1, 10_000))
def test_the_window_lets_exactly_the_rate_through(rate: float, per: int) -> None:
    throttler = pacer(rate, per=per).throttler
    units_per_window = throttler.rate_limit * per
    assert math.isclose(units_per_window / throttler.period, rate, rel_tol=1e-9)
    assert throttler.rate_limit >= 1 and 0 < throttler.retry_interval <= 0.01


@pytest.mark.parametrize("rate", [0, -1, float("nan"), float("inf")])
def test_a_rate_must_be_finite_and_above_zero(rate: float) -> None:
    with pytest.raises(ConfigError, match="finite number above 0"):
        pacer(rate)


async def test_waits_spread_acquires_over_time() -> None:
    paced = pacer(20)  # 20 a second
    loop = asyncio.get_running_loop()
    began = loop.time()
    for _ in range(30):
        await paced.wait()
    assert loop.time() - began >= 0.95  # the second window of 20 opens after 1 s
