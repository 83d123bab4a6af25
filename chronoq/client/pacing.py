"""Client-side pacing: at most a given number of starts per second, with asyncio-throttle.

Pacing waits; it never refuses. The server's submit quota and the cluster-wide queue limits
are refusing token buckets (``chronoq.ratelimit`` and the store) and stay so.
"""

from __future__ import annotations

import math

from asyncio_throttle.throttler import Throttler

from chronoq.errors import ConfigError

#: The longest a paced caller sleeps between two looks at its throttle (seconds).
MAX_RETRY_INTERVAL = 0.01


class Pacer:
    """Waits until the next unit may go (a typed face for ``asyncio_throttle.Throttler``)."""

    def __init__(self, throttler: Throttler) -> None:
        self.throttler = throttler

    async def wait(self) -> None:
        await self.throttler.acquire()  # type: ignore[no-untyped-call]


def pacer(rate: float, *, per: int = 1) -> Pacer:
    """A throttle that lets ``rate`` units a second through, ``per`` units at each acquire.

    Fractional rates keep their value on average: ``ceil(rate / per)`` acquires are allowed in
    each window of ``ceil(rate / per) * per / rate`` seconds.
    """
    if not math.isfinite(rate) or rate <= 0:
        raise ConfigError(f"a rate must be a finite number above 0, got {rate!r}")
    if per < 1:
        raise ConfigError(f"units per acquire must be at least 1, got {per}")
    slots = max(1, math.ceil(rate / per))
    period = slots * per / rate
    return Pacer(
        Throttler(
            rate_limit=slots, period=period, retry_interval=min(MAX_RETRY_INTERVAL, period / 4)
        )
    )
