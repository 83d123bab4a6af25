"""Background duties of a node besides firing: retention, health and queue depth."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from chronoq.buckets import bucket_of
from chronoq.clock import Clock
from chronoq.errors import ChronoqError
from chronoq.models import TaskState
from chronoq.node.ownership import Ownership
from chronoq.store import Store

log = logging.getLogger("chronoq.node")

FINISHED = (TaskState.SUCCEEDED, TaskState.CANCELLED, TaskState.SKIPPED)


class Retention:
    """Purges finished tasks of owned partitions, oldest first, in small batches.

    It never takes the owner gate and pauses between batches, so firing is never held up;
    deleting finished rows needs no fencing (no owner's decision depends on them). Note that
    an idempotency key can be reused once its task has been purged.
    """

    def __init__(
        self,
        store: Store,
        ownership: Ownership,
        clock: Clock,
        *,
        retention: timedelta | None,
        dead_retention: timedelta | None,
        interval: float,
        batch: int,
        on_purged: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self._store = store
        self._ownership = ownership
        self._clock = clock
        self._rules = [
            (states, keep)
            for states, keep in ((FINISHED, retention), ((TaskState.DEAD,), dead_retention))
            if keep is not None
        ]
        self._interval = interval
        self._batch = batch
        self._on_purged = on_purged
        self.purged = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.purge()
            except ChronoqError as exc:
                log.warning("retention pass failed: %s", exc)

    async def purge(self) -> int:
        total = 0
        partitions = sorted(self._ownership.owned())
        for states, keep in self._rules:
            before = self._clock.now() - keep
            while True:
                n = await self._store.purge_finished(partitions, states, before, self._batch)
                total += n
                self._on_purged(n)
                if n < self._batch:
                    break
                await asyncio.sleep(0.05)  # leave room for the firing loop between batches
        self.purged += total
        return total


class DepthPoller:
    """Keeps the latest queue depth for the metrics endpoint (polled, never on a scrape)."""

    def __init__(self, store: Store, clock: Clock, *, interval: float = 15.0) -> None:
        self._store = store
        self._clock = clock
        self._interval = interval
        self.depth: dict[tuple[str, str, str], int] = {}

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except ChronoqError as exc:
                log.warning("queue depth poll failed: %s", exc)
            await asyncio.sleep(self._interval)

    async def poll(self) -> dict[tuple[str, str, str], int]:
        now = bucket_of(self._clock.now(), self._store.bucket_seconds)
        horizon = max(1, 3600 // self._store.bucket_seconds)
        self.depth = await self._store.queue_depth(
            range(self._store.partitions), now - 1, now + horizon
        )
        return self.depth


class HealthWatch:
    """SERVING while the node owns at least part of what it should; NOT_SERVING otherwise
    (its lease is gone, or it cannot take the partitions assigned to it)."""

    def __init__(
        self,
        ownership: Ownership,
        set_serving: Callable[[bool], Awaitable[None]],
        *,
        interval: float = 0.5,
    ) -> None:
        self._ownership = ownership
        self._set_serving = set_serving
        self._interval = interval
        self.serving: bool | None = None

    def healthy(self) -> bool:
        expected = self._ownership.expected()
        return not expected or bool(expected & set(self._ownership.owned()))

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._interval)

    async def check(self) -> bool:
        now = self.healthy()
        if now != self.serving:
            self.serving = now
            await self._set_serving(now)
            log.info("health: %s", "SERVING" if now else "NOT_SERVING")
        return now


class StoreWatch:
    """Hands the partitions to other nodes while this one cannot reach PostgreSQL.

    A node cut off from the store but not from etcd would otherwise keep renewing its lease
    and hold partitions that nobody fires. When no firing tick has reached the store for
    ``grace`` seconds, the ownership is suspended (partitions released); once the store
    answers again, it resumes.
    """

    def __init__(
        self,
        store: Store,
        ownership: Ownership,
        last_ok: Callable[[], float],
        *,
        grace: float,
        interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._ownership = ownership
        self._last_ok = last_ok
        self._grace = grace
        self._interval = interval
        self._monotonic = monotonic
        self.suspensions = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.check()
            except ChronoqError as exc:
                log.warning("store watch: %s", exc)

    async def check(self) -> None:
        if self._ownership.suspended:
            if await self._store.probe():
                await self._ownership.resume()
        elif self._monotonic() - self._last_ok() > self._grace:
            self.suspensions += 1
            await self._ownership.suspend()
