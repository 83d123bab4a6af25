"""Supervised background loops: one error policy and honest health for every loop of a node.

A loop runs one *pass* (an async step) every ``interval``. A pass that raises is counted and
retried after a backoff. Logs stay quiet under faults: a burst of failures logs one line when
it starts (a ``ChronoqError`` such as ``StoreUnavailable`` is an expected outage, logged
without a traceback; anything else carries its traceback once) and one line when the loop
recovers, with the number of failed passes and how long it lasted.

A loop is unhealthy while it keeps failing (at least ``unhealthy_passes`` in a row for at
least ``unhealthy_after`` seconds), while a pass hangs past its ``stall_after``, or once it
died: its task ended although nobody stopped it. A dead loop is reported and restarted after
a backoff, so no loop ends silently; it counts as healthy again after its next good pass.
The node folds the critical loops' health into its gRPC health service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from chronoq.errors import ChronoqError
from chronoq.retry import backoff

log = logging.getLogger("chronoq.loops")

# A short blip (a PostgreSQL restart, an etcd leader election) must not flip health; a loop
# that has achieved nothing for this long cannot do what the node promises.
UNHEALTHY_AFTER = 10.0  # seconds of continuous failure ...
UNHEALTHY_PASSES = 3  # ... and at least this many failed passes in a row
# Retries slow down to this, so an outage costs about one attempt a second per loop, and a
# loop resumes within this long once the outage is over.
MAX_BACKOFF = 1.0
# Every statement gives up after the store's command timeout (15 s): a pass that runs this
# long is stuck somewhere else.
STALL_AFTER = 60.0
STOP_TIMEOUT = 5.0  # a loop that ignores its cancellation must not hold a stop forever

Step = Callable[[], Awaitable[object]]
Interval = float | Callable[[], float]


def paced_interval(interval: float, share: float, last: float) -> float:
    """Seconds between the pass starts of a loop whose passes may take at most ``share`` of
    the time, after a pass that took ``last`` seconds: ``interval``, or ``last / share`` once
    passes grow (a poll whose reads grow with the data: staler figures rather than a busy
    store)."""
    return max(interval, last / share)


@dataclass(frozen=True, kw_only=True)
class LoopPolicy:
    """When a failing loop counts as unhealthy, and how far its retries back off."""

    unhealthy_after: float = UNHEALTHY_AFTER
    unhealthy_passes: int = UNHEALTHY_PASSES
    max_backoff: float = MAX_BACKOFF


def retry_delay(failures: int, first: float, cap: float) -> float:
    """Seconds before the pass that follows ``failures`` failed passes in a row (>= 1):
    ``first`` doubled per failure, capped at ``cap`` (and never below ``first``)."""
    return backoff(
        max(1, failures),
        initial=timedelta(seconds=first),
        maximum=timedelta(seconds=max(first, cap)),
        jitter=0.0,
    ).total_seconds()


class Loop:
    """One supervised loop; made by ``Supervisor.every``. Figures are read by metrics."""

    def __init__(
        self,
        supervisor: Supervisor,
        name: str,
        step: Step,
        *,
        interval: Interval,
        retry: float | None,
        backoff: bool,
        wake: asyncio.Event | None,
        initial_delay: bool,
        critical: bool,
        stall_after: float | None,
        share: float | None = None,
    ) -> None:
        self.name = name
        self.critical = critical
        self.stall_after = stall_after
        self._supervisor = supervisor
        self._step = step
        self._interval = interval
        self._retry = retry
        self._backoff = backoff
        self._wake = wake
        self._initial_delay = initial_delay
        self._share = share
        self.passes = 0  # passes begun
        self.ended = 0  # passes ended, well or not: a caller can wait for one to be over
        self.failures = 0  # failed passes since the loop started, deaths included
        self.restarts = 0
        self.failing = 0  # failed passes in a row: the current burst
        self.failing_since: float | None = None  # monotonic start of the current burst
        self.last_error = ""
        self.dead = False
        self._traceback_logged = False
        self._pass_started: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._restart: asyncio.TimerHandle | None = None
        self._stopping = False

    # ------------------------------------------------------------------ health

    def problem(self) -> str | None:
        """Why this loop is unhealthy now, or None."""
        now = self._supervisor.monotonic()
        if self.dead:
            return f"loop {self.name} died: {self.last_error}"
        started = self._pass_started
        if started is not None and self.stall_after is not None:
            if now - started > self.stall_after:
                return f"loop {self.name}: a pass has been running for {now - started:.0f} s"
        policy = self._supervisor.policy
        since = self.failing_since
        if (
            since is not None
            and self.failing >= policy.unhealthy_passes
            and now - since >= policy.unhealthy_after
        ):
            return (
                f"loop {self.name} failing for {now - since:.0f} s "
                f"({self.failing} passes): {self.last_error}"
            )
        return None

    @property
    def healthy(self) -> bool:
        return self.problem() is None

    def ok(self) -> None:
        """The loop works: ends a burst of failures (with its one recovery line).

        Called after every good pass; a long-lived pass (a watch stream) calls it itself
        once it is established.
        """
        if self.failing_since is not None:
            log.warning(
                "loop %s recovered after %d failed passes in %.1f s",
                self.name,
                self.failing,
                self._supervisor.monotonic() - self.failing_since,
            )
        self.dead = False
        self.failing = 0
        self.failing_since = None
        self._traceback_logged = False

    def _failed(self, exc: BaseException, *, died: bool = False) -> None:
        self.failures += 1
        self.failing += 1
        self.last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        first = self.failing_since is None
        if first:
            self.failing_since = self._supervisor.monotonic()
        expected = isinstance(exc, ChronoqError)
        what = "died" if died else "failing"
        if expected and first:
            log.warning("loop %s %s: %s", self.name, what, exc)
        elif not expected and not self._traceback_logged:
            self._traceback_logged = True
            log.error("loop %s %s: %s", self.name, what, self.last_error, exc_info=exc)
        else:
            log.debug("loop %s: failed pass %d in a row: %s", self.name, self.failing, exc)

    # ------------------------------------------------------------------ running

    def _interval_now(self) -> float:
        return self._interval() if callable(self._interval) else self._interval

    def _retry_now(self) -> float:
        first = self._retry if self._retry is not None else self._interval_now()
        cap = self._supervisor.policy.max_backoff if self._backoff else first
        return retry_delay(self.failing, first, cap)

    def _spawn(self) -> None:
        self._restart = None
        if self._stopping:
            return
        self._task = asyncio.create_task(self._run(), name=f"chronoq-loop-{self.name}")
        self._task.add_done_callback(self._ended)

    async def _run(self) -> None:
        if self._initial_delay and self.restarts == 0:
            await self._pause(self._interval_now())
        loop = asyncio.get_running_loop()
        while not self._stopping:
            started = loop.time()
            if self._wake is not None:
                self._wake.clear()  # a poke during the pass runs the next one at once
            self.passes += 1
            self._pass_started = self._supervisor.monotonic()
            try:
                await self._step()
            except Exception as exc:  # noqa: BLE001 - the loop outlives any single bad pass
                self._failed(exc)
                delay = self._retry_now()
            else:
                self.ok()
                took = loop.time() - started
                interval = self._interval_now()
                if self._share is not None:
                    interval = paced_interval(interval, self._share, took)
                delay = interval - took
            finally:
                self._pass_started = None
                self.ended += 1
            if self._stopping:
                return
            await self._pause(delay)

    async def _pause(self, delay: float) -> None:
        if delay <= 0:
            await asyncio.sleep(0)  # yield, even to a loop that is always behind
            return
        if self._wake is None:
            await asyncio.sleep(delay)
            return
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that races with the event, and the loop would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._wake.wait()

    def _ended(self, task: asyncio.Task[None]) -> None:
        """Done callback: a loop's task ended. Unless it was stopped, it died: report it
        (health, metrics, one log line per burst) and start it again after a backoff."""
        if self._stopping or task is not self._task:
            return
        if task.cancelled():
            exc: BaseException = asyncio.CancelledError("cancelled by someone else")
        else:
            exc = task.exception() or RuntimeError("returned")
        self.restarts += 1
        self._failed(exc, died=True)
        self.dead = True
        delay = self._retry_now()
        log.debug("loop %s restarts in %.1f s", self.name, delay)
        self._restart = asyncio.get_running_loop().call_later(delay, self._spawn)

    def cancel(self) -> None:
        """Stop the loop (the pass in flight is cancelled); ``Supervisor.stop`` waits for it."""
        self._stopping = True
        if self._restart is not None:
            self._restart.cancel()
            self._restart = None
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        await self._supervisor.stop([self])


class Supervisor:
    """Runs loops under one policy and answers whether the critical ones are healthy."""

    def __init__(
        self,
        policy: LoopPolicy | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy or LoopPolicy()
        self.monotonic = monotonic
        self._loops: dict[str, Loop] = {}

    def every(
        self,
        name: str,
        step: Step,
        *,
        interval: Interval,
        retry: float | None = None,
        backoff: bool = True,
        wake: asyncio.Event | None = None,
        initial_delay: bool = False,
        critical: bool = True,
        stall_after: float | None = None,
        share: float | None = None,
    ) -> Loop:
        """Start running ``step`` every ``interval`` seconds (between pass starts).

        Args:
            retry: delay after a failed pass (default: the interval), doubled per failure in
                a row up to the policy's ``max_backoff`` unless ``backoff`` is False.
            wake: an event that ends a wait early (e.g. "ownership changed: fire now").
            initial_delay: wait one interval before the first pass.
            critical: whether the node's health depends on this loop.
            stall_after: a pass running longer than this makes the loop unhealthy.
            share: the most of the time its passes may take (0 < share <= 1): after a
                long pass the next waits longer (``paced_interval``).
        """
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"loop {name}: share must be in (0, 1], got {share}")
        if name in self._loops:
            raise ValueError(f"a loop named {name!r} is running already")
        loop = Loop(
            self,
            name,
            step,
            interval=interval,
            retry=retry,
            backoff=backoff,
            wake=wake,
            initial_delay=initial_delay,
            critical=critical,
            stall_after=stall_after,
            share=share,
        )
        self._loops[name] = loop
        loop._spawn()
        return loop

    @property
    def loops(self) -> list[Loop]:
        return list(self._loops.values())

    def problems(self) -> list[str]:
        """Why the critical loops are unhealthy; empty when they are all fine."""
        return [p for loop in self._loops.values() if loop.critical and (p := loop.problem())]

    def healthy(self) -> bool:
        return not self.problems()

    async def stop(
        self, loops: Iterable[Loop] | None = None, *, timeout: float = STOP_TIMEOUT
    ) -> list[Loop]:
        """Cancel ``loops`` (default: all) and wait for them, bounded; returns those stuck."""
        chosen = list(self._loops.values()) if loops is None else list(loops)
        for loop in chosen:
            loop.cancel()
        tasks = {loop._task: loop for loop in chosen if loop._task is not None}
        stuck: list[Loop] = []
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            stuck = [tasks[t] for t in pending]
        for loop in chosen:
            if self._loops.get(loop.name) is loop:
                del self._loops[loop.name]
        for loop in stuck:
            log.error("loop %s did not stop within %.0f s", loop.name, timeout)
        return stuck
