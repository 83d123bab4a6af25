"""Long conversions give the event loop back every few milliseconds.

A node serves every caller, runs its firing loop and renews its etcd lease on one event loop.
Converting the largest request a node accepts (10,000 task specs, or a page of 1,000 tasks)
costs tens to hundreds of milliseconds of pure Python; done in one go, it delays every other
call and every timer by as much. Loops over a request's items therefore yield once their slice
of time is spent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

#: Seconds of work between two yields to the event loop: no other caller waits longer than
#: this behind one request's conversion.
SLICE = 0.002

T = TypeVar("T")
R = TypeVar("R")


class Timeslice:
    """``await slice.pause_if_due()`` in a loop: yields once ``budget`` seconds have passed
    since the last yield (or since the slice was made)."""

    def __init__(
        self, budget: float = SLICE, *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._budget = budget
        self._clock = clock
        self._ends = clock() + budget
        self.pauses = 0

    async def pause_if_due(self) -> None:
        if self._clock() >= self._ends:
            await asyncio.sleep(0)
            self.pauses += 1
            self._ends = self._clock() + self._budget


async def converted(items: Iterable[T], convert: Callable[[T], R]) -> list[R]:
    """``[convert(item) for item in items]``, yielding to the event loop every ``SLICE``."""
    timeslice = Timeslice()
    out: list[R] = []
    for item in items:
        out.append(convert(item))
        await timeslice.pause_if_due()
    return out
