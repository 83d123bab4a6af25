"""The schedule pump: the owner of a schedule's partition turns its occurrences into tasks."""

from __future__ import annotations

import logging
from datetime import timedelta

from chronoq.clock import Clock
from chronoq.coordinator.protocols import Ownership
from chronoq.store.schedules import Materialized, Schedules
from chronoq.supervision import STALL_AFTER, Loop, Supervisor

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

    def start(self, supervisor: Supervisor) -> Loop:
        """Materialise every ``interval`` seconds under ``supervisor``."""
        return supervisor.every(
            "schedules", self.pump, interval=self._interval, stall_after=STALL_AFTER
        )

    async def pump(self) -> Materialized:
        """One pass; repeats while a batch came back full."""
        total = Materialized()
        for _ in range(100):
            async with self._ownership.gate:
                owned = dict(self._ownership.owned())
                done = await self._schedules.materialize(
                    owned, self._clock.now(), lookahead=self._lookahead
                )
            total.add(done)
            # A paused (quarantined) schedule took a place in the batch too.
            if done.schedules + len(done.quarantined) < 100:
                break
        self.created += total.created
        self.skipped += total.skipped
        return total
