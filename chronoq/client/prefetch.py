"""How many tasks a worker may hold beyond those it runs: pure arithmetic, no I/O.

A worker whose handlers are quick spends most of a slot's cycle on the round trip that
refills it (ack, claim or push, message). Holding a few leased tasks ready to start hides that
trip: a freed slot starts the next one at once. A held task waits for a slot, though, so the
worker holds only what its slots will start within ``PREFETCH_HORIZON`` at the handlers'
recent pace: quick handlers get the full ``prefetch``, slow ones none (a long task never
waits behind another on a worker while a different worker sits idle).
"""

from __future__ import annotations

import math

#: A held task should start within this many seconds, on average, at the recent pace.
PREFETCH_HORIZON = 0.02
#: Weight of the newest handler duration in the running mean.
SMOOTHING = 0.1


def prefetch_limit(
    prefetch: int, concurrency: int, mean_seconds: float | None, horizon: float = PREFETCH_HORIZON
) -> int:
    """Tasks to hold beyond ``concurrency``: at most ``prefetch``, and no more than the slots
    start within ``horizon`` when each handler takes ``mean_seconds`` (None: not known yet,
    so nothing is held)."""
    if prefetch <= 0 or mean_seconds is None or not math.isfinite(mean_seconds):
        return 0
    if mean_seconds <= 0:
        return prefetch
    fits = horizon * concurrency / mean_seconds
    return prefetch if fits >= prefetch else max(0, math.floor(fits))


class HandlerPace:
    """The running mean of handler durations (seconds), weighted toward the latest."""

    def __init__(self, smoothing: float = SMOOTHING) -> None:
        self.smoothing = smoothing
        self.mean: float | None = None

    def add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if self.mean is None:
            self.mean = seconds
        else:
            self.mean += self.smoothing * (seconds - self.mean)
