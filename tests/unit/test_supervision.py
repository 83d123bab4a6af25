"""The supervised loop: one error policy, quiet logs, honest health, no silent death."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.errors import StoreUnavailable
from chronoq.supervision import LoopPolicy, Supervisor, paced_interval, retry_delay

FAST = LoopPolicy(unhealthy_after=0.0, unhealthy_passes=3, max_backoff=0.02)
LOGGER = "chronoq.loops"


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


class Switch:
    """A step that fails (with ``error``) while ``broken`` and counts its passes."""

    def __init__(self, error: Exception | BaseException | None = None) -> None:
        self.error = error
        self.passes = 0

    async def __call__(self) -> None:
        self.passes += 1
        if self.error is not None:
            raise self.error


@pytest.fixture
async def supervisor() -> AsyncIterator[Supervisor]:
    sup = Supervisor(FAST)
    try:
        yield sup
    finally:
        assert await sup.stop() == []


def records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and text in r.getMessage()]


async def test_an_outage_logs_one_line_when_it_starts_and_one_when_it_ends(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    step = Switch(StoreUnavailable("PostgreSQL unavailable: ConnectionRefusedError"))
    loop = supervisor.every("firing", step, interval=0.001)
    await until(lambda: loop.failing >= 20)
    assert not loop.healthy and not supervisor.healthy()
    assert "loop firing failing" in supervisor.problems()[0]
    assert "ConnectionRefusedError" in supervisor.problems()[0]
    step.error = None
    await until(lambda: loop.healthy and step.passes > loop.failures)
    assert supervisor.healthy()

    started = records(caplog, "failing")
    assert len(started) == 1
    assert started[0].levelno == logging.WARNING
    assert started[0].exc_info is None  # an expected outage: no traceback
    assert "ConnectionRefusedError" in started[0].getMessage()
    ended = records(caplog, "recovered")
    assert len(ended) == 1
    assert f"after {loop.failures} failed passes" in ended[0].getMessage()
    assert len([r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO]) == 2


async def test_an_unexpected_error_carries_its_traceback_once_per_burst(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    step = Switch(OverflowError("date value out of range"))
    loop = supervisor.every("reaper", step, interval=0.001)
    await until(lambda: loop.failing >= 10)
    step.error = None
    await until(lambda: loop.failing == 0)
    step.error = OverflowError("again")
    await until(lambda: loop.failing >= 10)

    tracebacks = records(caplog, "failing")
    assert [r.exc_info is not None for r in tracebacks] == [True, True]  # one per burst
    assert tracebacks[0].levelno == logging.ERROR
    assert "OverflowError: date value out of range" in tracebacks[0].getMessage()


async def test_health_waits_for_the_threshold_in_passes_and_in_time() -> None:
    now = [1000.0]
    sup = Supervisor(
        LoopPolicy(unhealthy_after=10.0, unhealthy_passes=3, max_backoff=0.001),
        monotonic=lambda: now[0],
    )
    step = Switch(StoreUnavailable())
    loop = sup.every("schedules", step, interval=0.001)
    try:
        await until(lambda: loop.failing >= 5)
        assert loop.healthy  # many passes, but not for 10 s yet
        now[0] += 10.0
        assert not loop.healthy
        assert "failing for 10 s" in (loop.problem() or "")
        step.error = None
        await until(lambda: loop.failing == 0)
        assert loop.healthy
        assert loop.failures >= 5
    finally:
        await sup.stop()


async def test_one_failed_pass_does_not_flip_health(supervisor: Supervisor) -> None:
    calls = [0]

    async def flaky() -> None:
        calls[0] += 1
        if calls[0] in (1, 2):
            raise StoreUnavailable()

    loop = supervisor.every("retention", flaky, interval=0.001)
    await until(lambda: calls[0] >= 5)
    assert loop.failures == 2 and loop.failing == 0
    assert loop.healthy


class Boom(BaseException):
    """Escapes ``except Exception``: the loop's task itself ends."""


async def test_a_loop_that_dies_is_reported_unhealthy_and_restarted(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    step = Switch(Boom("lost"))
    loop = supervisor.every("store-watch", step, interval=0.001)
    await until(lambda: loop.restarts >= 3)
    assert loop.dead
    assert "loop store-watch died: Boom: lost" in supervisor.problems()
    died = records(caplog, "died")
    assert len(died) == 1 and died[0].exc_info is not None  # once per burst, with traceback
    step.error = None
    await until(lambda: not loop.dead)
    assert loop.healthy
    assert loop.failures >= 3
    assert len(records(caplog, "recovered")) == 1


async def test_a_loop_cancelled_by_someone_else_is_restarted(supervisor: Supervisor) -> None:
    step = Switch()
    loop = supervisor.every("depth", step, interval=0.001)
    await until(lambda: step.passes > 0)
    task = loop._task
    assert task is not None
    task.cancel()
    await until(lambda: loop.restarts == 1 and step.passes > 5 and not loop.dead)
    assert loop._task is not task and not loop._task.done()  # type: ignore[union-attr]


async def test_a_hung_pass_makes_the_loop_unhealthy(supervisor: Supervisor) -> None:
    release = asyncio.Event()

    async def hang() -> None:
        await release.wait()

    loop = supervisor.every("health", hang, interval=0.001, stall_after=0.05)
    await until(lambda: not loop.healthy)
    assert "a pass has been running" in (loop.problem() or "")
    release.set()
    await until(lambda: loop.healthy)


async def test_non_critical_loops_do_not_decide_health(supervisor: Supervisor) -> None:
    loop = supervisor.every(
        "publish-stats", Switch(StoreUnavailable()), interval=0.001, critical=False
    )
    await until(lambda: loop.failing >= 5)
    assert not loop.healthy
    assert supervisor.healthy()


async def test_a_wake_runs_the_next_pass_at_once(supervisor: Supervisor) -> None:
    wake = asyncio.Event()
    step = Switch()
    supervisor.every("firing", step, interval=3600, wake=wake)
    await until(lambda: step.passes == 1)
    wake.set()
    await until(lambda: step.passes == 2)


async def test_a_pass_counts_as_ended_only_once_its_step_returns_or_raises(
    supervisor: Supervisor,
) -> None:
    gate = asyncio.Event()

    async def held() -> None:
        await gate.wait()

    loop = supervisor.every("held", held, interval=3600)
    await until(lambda: loop.passes == 1)
    await asyncio.sleep(0.02)
    assert loop.ended == 0  # begun, not over: what a caller waiting for the pass must see
    gate.set()
    await until(lambda: loop.ended == 1)
    failing = supervisor.every("failing", Switch(StoreUnavailable()), interval=3600, retry=3600)
    await until(lambda: failing.ended == 1)
    assert failing.failures == 1


async def test_stop_ends_loops_in_a_pass_or_in_a_wait_promptly() -> None:
    sup = Supervisor(FAST)

    async def forever() -> None:
        await asyncio.sleep(3600)

    waiting = Switch()
    sup.every("in-pass", forever, interval=1)
    sup.every("in-wait", waiting, interval=3600, wake=asyncio.Event())
    sup.every("in-backoff", Switch(StoreUnavailable()), interval=3600, retry=3600)
    await until(lambda: waiting.passes == 1)
    started = time.monotonic()
    assert await sup.stop() == []
    assert time.monotonic() - started < 3.0  # generous: a stuck loop would take 5 s
    assert sup.loops == []


async def test_a_dead_loop_is_not_restarted_after_stop() -> None:
    sup = Supervisor(LoopPolicy(max_backoff=3600))
    step = Switch(Boom())
    loop = sup.every("dies", step, interval=3600, retry=3600)
    await until(lambda: loop.dead)
    await sup.stop()
    await asyncio.sleep(0.05)
    assert step.passes == 1 and loop._restart is None


async def test_names_are_unique_while_running(supervisor: Supervisor) -> None:
    supervisor.every("firing", Switch(), interval=1)
    with pytest.raises(ValueError, match="firing"):
        supervisor.every("firing", Switch(), interval=1)


@given(
    failures=st.integers(min_value=1, max_value=10_000),
    first=st.floats(min_value=0.001, max_value=100),
    cap=st.floats(min_value=0, max_value=100),
)
def test_retry_delay_doubles_within_its_bounds(failures: int, first: float, cap: float) -> None:
    delay = retry_delay(failures, first, cap)
    assert first - 1e-6 <= delay <= max(first, cap) + 1e-6
    assert retry_delay(failures + 1, first, cap) >= delay - 1e-6
    if failures == 1:
        assert delay == pytest.approx(first, abs=1e-6)


async def test_a_paced_poll_keeps_its_share_of_the_time() -> None:
    assert paced_interval(2.0, 0.02, 0.0) == 2.0  # nothing measured yet: the interval
    assert paced_interval(2.0, 0.02, 0.01) == 2.0  # cheap: the interval
    assert paced_interval(2.0, 0.02, 1.5) == pytest.approx(75.0)  # 1.5 s is 2 % of 75 s
    sup = Supervisor(FAST)
    with pytest.raises(ValueError):
        sup.every("never", lambda: asyncio.sleep(0), interval=1.0, share=0.0)
