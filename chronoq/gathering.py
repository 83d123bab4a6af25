"""How long a busy owner gathers due tasks before its next fire statement: pure arithmetic.

A fire statement has a fixed cost (a round trip, planning, a message to each worker stream
and an ack batch coming back) paid per statement, whatever it carries. Firing every instant
on its own is right while statements are rare; an owner whose tasks come due faster pays that
cost for every few tasks, fills the machine's cores, and then every task waits in the queue
for them (at 5,000 due/s on three nodes: ~10 tasks a statement, 1.8 of 2 cores busy, a
handler-start p99 near 200 ms; gathering: 17 a statement, 1.54 cores, 28 ms).
"""

from __future__ import annotations

import math

#: When tasks come due fast enough to fill statements of ``BUSY_BATCH`` within ``BUSY_GAP``
#: seconds, the fire loop gathers them for that long (``gather_for``); slower than that, each
#: instant fires as it comes.
BUSY_BATCH = 16
BUSY_GAP = 0.015
#: Seconds over which the fire loop's rate of due tasks is averaged (``DueRate``).
RATE_WINDOW = 0.25


def gather_for(rate: float) -> float:
    """Seconds the fire loop gathers due tasks before its next statement, at ``rate`` due
    tasks a second: long enough for ``BUSY_BATCH`` of them, when that takes at most
    ``BUSY_GAP``; none otherwise (each instant fires as it comes)."""
    if rate * BUSY_GAP < BUSY_BATCH:
        return 0.0
    return BUSY_BATCH / rate


class DueRate:
    """Tasks a second, averaged over about ``window`` seconds (a counter that leaks
    exponentially: no list of events to keep)."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._level = 0.0
        self._at: float | None = None

    def _decay(self, now: float) -> None:
        if self._at is not None:
            if now <= self._at:
                return  # not after the last reading: nothing leaked since
            self._level *= math.exp(-(now - self._at) / self._window)
        self._at = now

    def add(self, n: int, now: float) -> None:
        self._decay(now)
        self._level += n

    def per_second(self, now: float) -> float:
        self._decay(now)
        return self._level / self._window
