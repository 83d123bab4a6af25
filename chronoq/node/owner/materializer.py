"""The schedule pump: the owner of a schedule's partition turns its occurrences into tasks.

With a submit quota, each occurrence is paid from its namespace's bucket on this node (the
one its submits take from) as it is made, so no churn of schedules makes more than the quota
(``chronoq.ratelimit``). Occurrences are then made only ``QUOTA_LOOKAHEAD`` ahead: a minute
ahead would pay a minute of every new schedule at once, from a bucket that banks a second.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from chronoq.clock import Clock
from chronoq.coordinator.protocols import Ownership
from chronoq.ratelimit import Quotas
from chronoq.store.port import ScheduleOwner
from chronoq.store.schedules import Materialized
from chronoq.supervision import STALL_AFTER, Loop, Supervisor

log = logging.getLogger("chronoq.schedules")

#: How far ahead occurrences are made under a submit quota: past the timing wheel's horizon
#: and a few passes, so they still fire on time.
QUOTA_LOOKAHEAD = timedelta(seconds=5)


class QuotaCharge:
    """``Schedules.materialize``'s ``Charge`` from the node's submit quotas."""

    def __init__(self, quotas: Quotas) -> None:
        self._quotas = quotas

    def available(self, namespace: str) -> int:
        return self._quotas.available(namespace, asyncio.get_running_loop().time())

    def take(self, namespace: str, n: int) -> None:
        self._quotas.take(namespace, n, asyncio.get_running_loop().time())


class SchedulePump:
    """Every ``interval``, materialise due occurrences of owned schedules (fenced writes)."""

    def __init__(
        self,
        schedules: ScheduleOwner,
        ownership: Ownership,
        clock: Clock,
        *,
        interval: float = 1.0,
        lookahead: timedelta = timedelta(seconds=60),
        quotas: Quotas | None = None,
    ) -> None:
        self._schedules = schedules
        self._ownership = ownership
        self._clock = clock
        self._interval = interval
        self._charge = QuotaCharge(quotas) if quotas is not None else None
        self._lookahead = min(lookahead, QUOTA_LOOKAHEAD) if quotas is not None else lookahead
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
                    owned,
                    self._clock.now(),
                    lookahead=self._lookahead,
                    charge=self._charge,
                    spent=sorted(total.unpaid),
                )
            total.add(done)
            # A paused (quarantined) schedule took a place in the batch too. A namespace
            # that could not pay waits for the next pass (its bucket refills), and is left
            # out of this one's next batches so that its schedules hold no one else's place.
            if not done.unpaid and done.schedules + len(done.quarantined) < 100:
                break
        self.created += total.created
        self.skipped += total.skipped
        return total
