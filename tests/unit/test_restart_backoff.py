"""Restart delays of a supervised child: 0.5 s doubling to 10 s, forgotten after a calm minute."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronoq.embedded.restarts import RESTART_STABLE_S, RestartBackoff


def test_delays_double_up_to_the_cap() -> None:
    backoff = RestartBackoff()
    backoff.started(0.0)
    delays = []
    for i in range(8):  # a child that dies right after each start
        delays.append(backoff.delay(float(i)))
        backoff.started(float(i))
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_a_stable_minute_starts_over() -> None:
    backoff = RestartBackoff()
    backoff.started(0.0)
    for i in range(5):
        backoff.delay(float(i))
        backoff.started(float(i))
    assert backoff.delay(4.0 + RESTART_STABLE_S - 1) == 10.0  # not yet stable
    backoff.started(100.0)
    assert backoff.delay(100.0 + RESTART_STABLE_S) == 0.5


@given(st.lists(st.floats(min_value=0, max_value=120), min_size=1, max_size=50))
def test_delay_is_always_within_bounds(runs: list[float]) -> None:
    backoff = RestartBackoff()
    now = 0.0
    backoff.started(now)
    previous = 0.0
    for ran in runs:
        now += ran
        delay = backoff.delay(now)
        assert backoff.initial <= delay <= backoff.maximum
        # It only shrinks after a stable run, and then to the first delay.
        assert delay >= previous or (ran >= backoff.stable and delay == backoff.initial)
        previous = delay
        now += delay
        backoff.started(now)
