"""The lease reaper: running tasks whose worker stopped heartbeating go back to waiting."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from chronoq.clock import Clock
from chronoq.coordinator.protocols import Ownership
from chronoq.effects import Effects, freed, of_tasks
from chronoq.models import Task, TaskState
from chronoq.node.metrics import NodeMetrics
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
        on_effects: Callable[[Effects], None] = lambda _e: None,
        metrics: NodeMetrics | None = None,
    ) -> None:
        self._store = store
        self._ownership = ownership
        self._clock = clock
        self._interval = interval
        self._batch = batch
        self._rng = rng
        #: Applies what a batch did (READY retries wake claims, SCHEDULED ones go to the
        #: wheel): the dispatcher.
        self._on_effects = on_effects
        self._metrics = metrics
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
                self._reaped(batch)
            if len(batch) < self._batch:
                return done

    def _reaped(self, batch: list[Task]) -> None:
        if self._metrics is not None:
            self._metrics.reaped.inc(len(batch))
            self._metrics.dead.inc(sum(1 for t in batch if t.state is TaskState.DEAD))
        # Only tasks ready now wake anyone (one waiter each): a retry with a backoff goes to
        # the wheel and is announced when it fires, a dead task never; but a task with a
        # concurrency key frees its key's slot, which wakes a waiter of its queue.
        self._on_effects(of_tasks(batch).merge(freed(batch)))
