"""The schedule pump: the owner of a schedule's partition turns its occurrences into tasks."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from chronoq.clock import Clock
from chronoq.errors import StoreUnavailable
from chronoq.node.ownership import Ownership
from chronoq.store.schedules import Materialized, Schedules

log = logging.getLogger("chronoq.schedules")


class SchedulePump:
    """Every ``interval``, materialise due occurrences of owned schedules (fenced writes)."""

    def __init__(
        self,
        schedules: Schedules,
        ownership: Ownership,
        clock: Clock,
        *,
        interval: float = 1.0,
        lookahead: timedelta = timedelta(seconds=60),
    ) -> None:
        self._schedules = schedules
        self._ownership = ownership
        self._clock = clock
        self._interval = interval
        self._lookahead = lookahead
        self.created = 0
        self.skipped = 0

    async def run(self) -> None:
        while True:
            try:
                await self.pump()
            except StoreUnavailable as exc:
                log.warning("schedule pass failed: %s", exc)
            except Exception:  # the loop must outlive any single bad pass
                log.exception("schedule pass failed unexpectedly")
            await asyncio.sleep(self._interval)

    async def pump(self) -> Materialized:
        """One pass; repeats while a batch came back full."""
        total = Materialized()
        for _ in range(100):
            async with self._ownership.gate:
                owned = dict(self._ownership.owned())
                done = await self._schedules.materialize(
                    owned, self._clock.now(), lookahead=self._lookahead
                )
            total.created += done.created
            total.skipped += done.skipped
            total.schedules += done.schedules
            if done.schedules < 100:
                break
        self.created += total.created
        self.skipped += total.skipped
        return total
