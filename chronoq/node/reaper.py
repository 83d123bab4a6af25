"""The lease reaper: running tasks whose worker stopped heartbeating go back to waiting."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from chronoq.clock import Clock
from chronoq.coordinator.protocols import Ownership
from chronoq.models import Task
from chronoq.store.port import ByPartition
from chronoq.supervision import STALL_AFTER, Loop, Supervisor

log = logging.getLogger("chronoq.reaper")


class Reaper:
    """Returns expired leases of owned partitions: retry with backoff (attempt used) or DEAD."""

    def __init__(
        self,
        store: ByPartition,
        ownership: Ownership,
        clock: Clock,
        *,
        interval: float,
        batch: int,
        rng: random.Random | None = None,
        on_requeued: Callable[[list[Task]], None] = lambda _t: None,
    ) -> None:
        self._store = store
        self._ownership = ownership
        self._clock = clock
        self._interval = interval
        self._batch = batch
        self._rng = rng
        self._on_requeued = on_requeued
        self.reaped = 0

    def start(self, supervisor: Supervisor) -> Loop:
        """Reap every ``interval`` seconds under ``supervisor``."""
        return supervisor.every(
            "reaper", self.reap, interval=self._interval, stall_after=STALL_AFTER
        )

    async def reap(self) -> list[Task]:
        """One pass, in bounded batches until nothing expired is left."""
        done: list[Task] = []
        while True:
            async with self._ownership.gate:
                owned = dict(self._ownership.owned())
                batch = await self._store.reap_expired(
                    owned, self._clock.now(), batch=self._batch, rng=self._rng
                )
            done.extend(batch)
            self.reaped += len(batch)
            if batch:
                self._on_requeued(batch)
            if len(batch) < self._batch:
                return done
