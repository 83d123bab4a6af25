"""A node's clock against the store's: a wrong clock is a grey failure, so it stops firing.

Every node of a cluster fires by its own ``Clock``; a node whose clock runs ahead fires tasks
early, one that lags fires them late, and nothing else would notice. The nodes share one
reference, PostgreSQL's clock: a node reads ``clock_timestamp()`` and times the round trip,
so the offset is known within half of it (the reading happened somewhere inside the round
trip). When the offset is certainly beyond ``max_offset`` (``|offset| - rtt/2 > bound``) the
node leaves the assignment: its partitions are handed to the others, its health says
NOT_SERVING. It rejoins once the offset is certainly back within the bound
(``|offset| + rtt/2 <= bound``); in between it keeps its state, so noise cannot flap it.

Only clocks that follow the wall clock are checked: a virtual clock (tests, the lab) is far
from the store's on purpose. A single node has no one to hand off to, so it is not checked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from chronoq.clock import Clock, OffsetClock, SystemClock
from chronoq.coordinator.protocols import Ownership
from chronoq.store.port import ServerClock
from chronoq.supervision import Loop, Supervisor

log = logging.getLogger("chronoq.node")

#: Largest offset from the store's clock at which a node keeps firing.
DEFAULT_MAX_CLOCK_OFFSET = timedelta(milliseconds=500)
#: How often the offset is measured.
CLOCK_CHECK_INTERVAL = timedelta(seconds=2)
#: Round trips per measurement; the shortest one bounds the offset best.
CLOCK_SAMPLES = 3


@dataclass(frozen=True)
class OffsetSample:
    """The reference clock minus ours, known within ``± uncertainty``."""

    offset: timedelta
    uncertainty: timedelta


def sample(local_sent: datetime, reference: datetime, round_trip: timedelta) -> OffsetSample:
    """One reading: ``reference`` was read somewhere in ``round_trip`` after ``local_sent``
    (our clock); taken at the midpoint, it is off by at most half the round trip."""
    half = round_trip / 2
    return OffsetSample(reference - (local_sent + half), half)


def best(samples: Sequence[OffsetSample]) -> OffsetSample:
    """The reading with the shortest round trip (NTP's rule: the tightest bound wins)."""
    return min(samples, key=lambda s: s.uncertainty)


def is_skewed(reading: OffsetSample, bound: timedelta, *, was_skewed: bool) -> bool:
    """Whether the node's clock is off: certainly beyond ``bound``, certainly within it, or,
    when the uncertainty straddles the bound, as it was."""
    size = abs(reading.offset)
    if size - reading.uncertainty > bound:
        return True
    if size + reading.uncertainty <= bound:
        return False
    return was_skewed


def follows_wall_clock(clock: Clock) -> bool:
    """Whether ``clock`` is meant to tell real time (possibly shifted), not a virtual time."""
    return isinstance(clock, SystemClock | OffsetClock)


class ClockCheck:
    """Measures the node clock's offset from the store's and suspends the node's ownership
    while it is beyond ``max_offset``. ``problems()`` feeds the node's health."""

    def __init__(
        self,
        store: ServerClock,
        clock: Clock,
        ownership: Ownership,
        *,
        max_offset: timedelta = DEFAULT_MAX_CLOCK_OFFSET,
        interval: timedelta = CLOCK_CHECK_INTERVAL,
        samples: int = CLOCK_SAMPLES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._clock = clock
        self._ownership = ownership
        self.max_offset = max_offset
        self.interval = interval
        self._samples = max(1, samples)
        self._monotonic = monotonic
        self.skewed = False
        self.last: OffsetSample | None = None
        self.suspensions = 0

    def start(self, supervisor: Supervisor) -> Loop:
        """Measure every ``interval``; firing depends on it (critical)."""
        return supervisor.every(
            "clock-check", self.check, interval=self.interval.total_seconds(), initial_delay=True
        )

    def problems(self) -> list[str]:
        """Why this node should not serve because of its clock; empty when it may."""
        if not self.skewed or self.last is None:
            return []
        ms = self.last.offset / timedelta(milliseconds=1)
        return [
            f"clock off by {-ms:+.0f} ms from the store's (bound ±"
            f"{self.max_offset / timedelta(milliseconds=1):.0f} ms)"
        ]

    def may_resume(self) -> bool:
        """Whether another watcher (the store's) may rejoin the assignment: not while the
        clock is off."""
        return not self.skewed

    async def measure(self) -> OffsetSample:
        """The best of a few readings of the store's clock against ours."""
        readings = []
        async with self._store.server_clock() as server_now:
            for _ in range(self._samples):
                sent, started = self._clock.now(), self._monotonic()
                reference = await server_now()
                trip = timedelta(seconds=self._monotonic() - started)
                readings.append(sample(sent, reference, trip))
        return best(readings)

    async def prime(self) -> None:
        """Leave the assignment at once if ``first_reading`` found the clock off.

        Call right after the ownership starts: its first claim runs at the next await, after
        ``suspend`` has already shut the door, so a node with a wrong clock never fires.
        """
        if self.skewed:
            self.suspensions += 1
            log.warning("%s: taking no partition until it is back", self.problems()[0])
            await self._ownership.suspend(reason="clock off")

    async def first_reading(self) -> None:
        """The first measurement, before the ownership starts (see ``prime``)."""
        self.last = await self.measure()
        self.skewed = is_skewed(self.last, self.max_offset, was_skewed=False)

    async def check(self) -> bool:
        """Measure once and act on a change; returns whether the clock is off."""
        reading = await self.measure()
        self.last = reading
        now = is_skewed(reading, self.max_offset, was_skewed=self.skewed)
        if now and not self.skewed:
            self.skewed = True
            self.suspensions += 1
            log.warning("%s: handing off every partition until it is back", self.problems()[0])
            await self._ownership.suspend(reason="clock off")
        elif not now and self.skewed:
            self.skewed = False
            log.warning(
                "clock back within %.0f ms of the store's: rejoining",
                self.max_offset / timedelta(milliseconds=1),
            )
            await self._ownership.resume()
        return self.skewed


class CorrectedClock:
    """The node's clock, corrected by the measured offset while the check finds it off.

    The API answers with it (a task submitted as due now, the end of a lease), so a node with
    a wrong clock still answers right while it fires nothing: within the reading's
    uncertainty, and from the first measurement on (it runs before the server starts).
    """

    def __init__(self, clock: Clock, check: ClockCheck) -> None:
        self._clock = clock
        self._check = check

    def now(self) -> datetime:
        reading = self._check.last
        if self._check.skewed and reading is not None:
            return self._clock.now() + reading.offset
        return self._clock.now()
