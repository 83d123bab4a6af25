"""The firing loop: each tick, move the due tasks of owned partitions to READY.

Per tick it runs one statement over all owned partitions (bounded per partition, the bound
shared equally by the namespaces with due rows there, so one namespace's flood cannot hold
back another's tasks), then repeats only for partitions where a namespace filled its share,
up to ``fire_rounds`` statements or one tick's time, whichever comes first. Work per
tick follows the number of due tasks, never the number pending. The same loop is the
backfill: after downtime the buckets between a partition's watermark and now are simply due.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from chronoq import tracing
from chronoq.buckets import bucket_of
from chronoq.clock import Clock
from chronoq.coordinator.protocols import Ownership
from chronoq.effects import Effects
from chronoq.node.metrics import NodeMetrics
from chronoq.node.owner.lateness import LatenessWindow
from chronoq.store import FireResult
from chronoq.store.port import ByPartition
from chronoq.supervision import STALL_AFTER, Loop, Supervisor

log = logging.getLogger("chronoq.firing")

#: Rows per partition per statement at least, whatever ``fire_batch / partitions`` gives. It
#: is also how many namespaces with due rows a partition serves per statement: past it, the
#: next ones wait for a later statement. A statement commits as one, so its size is how long
#: a namespace's single due task may wait behind another's flood; 16 halved that wait against
#: 50 but cost a third of the flood's fire rate in node runs (more, smaller statements).
MIN_PER_PARTITION = 50


@dataclass
class FiringStats:
    fired: int = 0
    skipped: int = 0
    statements: int = 0
    ticks: int = 0
    errors: int = 0
    quarantined: int = 0  # due tasks no statement could fire, set aside as DEAD


class FiringAccount:
    """What the owner's fire statements did, the tick's and the timing wheel's alike: one
    count, one lateness window and the metrics, which both halves of the owner write to."""

    def __init__(self, *, node_id: str = "", metrics: NodeMetrics | None = None) -> None:
        self.node_id = node_id
        self._metrics = metrics
        self.stats = FiringStats()
        self.lateness = LatenessWindow()

    def add(self, result: FireResult) -> None:
        """Count one fire statement's result."""
        self.stats.statements += 1
        self.stats.fired += result.fired
        self.stats.skipped += result.skipped
        self.stats.quarantined += len(result.quarantined)
        self.lateness.add(result.lateness)
        tracing.fired(result.traced, self.node_id)  # no-op unless tracing is on
        if self._metrics is not None:
            self._metrics.fired.inc(result.fired)
            self._metrics.skipped.inc(result.skipped)
            for seconds in result.lateness:
                self._metrics.lateness.observe(seconds)


class Firer:
    """Fires due buckets of the partitions that ``ownership`` says are ours."""

    def __init__(
        self,
        store: ByPartition,
        ownership: Ownership,
        clock: Clock,
        *,
        tick: float,
        batch: int,
        rounds: int,
        on_effects: Callable[[Effects], None] = lambda _e: None,
        node_id: str = "",
        metrics: NodeMetrics | None = None,
        catch_all: float | None = None,
        account: FiringAccount | None = None,
    ) -> None:
        self.node_id = node_id
        self._metrics = metrics
        self._store = store
        self._ownership = ownership
        self._clock = clock
        self._tick = tick
        self._batch = batch
        self._rounds = rounds
        #: Applies what each statement did (its READY tasks wake claims): the dispatcher.
        self._on_effects = on_effects
        #: With a timing wheel, the seconds between ticks while they find nothing late: the
        #: wheel fires what it holds at its instant, and a tick is then only the catch-all for
        #: what it does not (see ``_interval``). None: every ``tick``.
        self._catch_all = catch_all
        self._quiet = False  # the last tick fired nothing late and left nothing behind
        self._watermarks: dict[int, int] = {}  # partition → bucket we last advanced it to
        #: Shared with the timing wheel (the owner's): its statements count as the tick's.
        self.account = (
            account if account is not None else FiringAccount(node_id=node_id, metrics=metrics)
        )
        self._wake = asyncio.Event()
        self.last_ok = time.monotonic()  # when the last tick reached the store

    @property
    def stats(self) -> FiringStats:
        return self.account.stats

    @property
    def lateness(self) -> LatenessWindow:
        return self.account.lateness

    def poke(self) -> None:
        """Run the next tick now (the clock jumped, or ownership changed)."""
        self._wake.set()

    def start(self, supervisor: Supervisor) -> Loop:
        """Tick every ``tick`` seconds under ``supervisor``, at once when poked."""
        return supervisor.every(
            "firing", self._pass, interval=self._interval, wake=self._wake, stall_after=STALL_AFTER
        )

    def _interval(self) -> float:
        """Seconds between tick starts: ``tick``; with a timing wheel, ``catch_all`` while
        ticks find nothing late. A tick that walks every owned partition's due range costs
        the store far more than the wheel's statements by id, and racing the wheel at the
        instant it fires turns tasks it would hand to a worker into READY ones; a tick that
        finds a task late by more than a tick (the wheel did not hold it), or more due than
        it fired, makes the next ones come every ``tick`` again."""
        if self._catch_all is None or not self._quiet:
            return self._tick
        return max(self._tick, self._catch_all)

    async def _pass(self) -> None:
        try:
            await self.tick()
        except Exception:
            self.stats.errors += 1
            raise  # the supervisor counts, logs once per burst and retries
        self.last_ok = time.monotonic()

    async def tick(self) -> FireResult:
        """One tick: fire what is due now in every owned partition; returns the totals."""
        self.stats.ticks += 1
        self._quiet = False  # until this tick says otherwise (a failed one is retried soon)
        now = self._clock.now()
        current = bucket_of(now, self._store.bucket_seconds)
        owned: Mapping[int, int] = dict(self._ownership.owned())
        total = FireResult()
        pending = owned
        loop = asyncio.get_running_loop()
        # Rounds stop after a tick's time: what comes due meanwhile (another namespace's task
        # behind a flood) waits for one statement at most, then the next tick's first one,
        # which walks every partition again with a fresh `now`.
        deadline = loop.time() + self._tick
        late = False  # fired a task more than a tick late: the wheel did not hold it
        for _ in range(self._rounds):
            async with self._ownership.gate:
                # Re-read ownership before each statement: a release may have happened.
                still = self._ownership.owned()
                pending = {p: t for p, t in pending.items() if still.get(p) == t}
                if not pending:
                    break
                per_partition = max(MIN_PER_PARTITION, math.ceil(self._batch / len(pending)))
                result = await self._store.fire_due(
                    pending, now, batch=per_partition, node_id=self.node_id
                )
            self._account(result, total)
            if result.ready_by_queue:
                self._on_effects(result.effects)
            late = late or any(seconds > self._tick for seconds in result.lateness)
            # Each namespace with due rows got a share of the batch (fair across namespaces);
            # go again where one filled its share.
            pending = {p: owned[p] for p in result.saturated() if p in owned}
            if loop.time() >= deadline:
                break
        await self._advance(owned, set(pending), current)
        self._quiet = not pending and not late
        if self._metrics is not None:
            self._metrics.rows_per_tick.observe(total.fired + total.skipped)
        return total

    def _account(self, result: FireResult, total: FireResult) -> None:
        self.account.add(result)
        total.fired += result.fired
        total.skipped += result.skipped
        total.ready_by_queue.update(result.ready_by_queue)
        total.per_partition.update(result.per_partition)
        total.quarantined += result.quarantined

    async def _advance(self, owned: Mapping[int, int], unfinished: set[int], current: int) -> None:
        """Move watermarks up to the current bucket for partitions with nothing left behind."""
        behind = {
            p: tok
            for p, tok in owned.items()
            if p not in unfinished and self._watermarks.get(p, -1) < current
        }
        if not behind:
            return
        async with self._ownership.gate:
            still = self._ownership.owned()
            behind = {p: t for p, t in behind.items() if still.get(p) == t}
            advanced = await self._store.advance_watermarks(behind, current)
        for p in behind:
            # Either advanced now, or already at/above `current` (or no longer ours).
            self._watermarks[p] = current
        log.debug("watermarks advanced to %d for %d partitions", current, len(advanced))

    def forget(self, partitions: set[int]) -> None:
        """Drop cached watermark knowledge for partitions we lost or re-took."""
        for p in partitions:
            self._watermarks.pop(p, None)
