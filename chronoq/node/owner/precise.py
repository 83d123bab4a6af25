"""Precise firing: an owner fires each task at its instant, not at the next tick.

Every ``load_every`` the owner reads the tasks of its partitions that come due within
``horizon`` (one statement over the current and next buckets' index ranges, bounded by the
wheel's free room; see ``due_soon`` in queries.sql) into a ``TimingWheel``, and a second loop
sleeps until the wheel's first instant and fires what is due then with one fenced statement
(``fire_listed``: same fencing-token check as the tick, ``run_at <= now`` in SQL too). Tasks
submitted for the near future enter the wheel at once (``offer``: directly on their owner,
through a notice from other nodes, see ``chronoq.node.dispatch.soon``).

The tick (``chronoq.node.owner.firing``) stays the catch-all: whatever the wheel does not hold
(refused when full, lost with a failed statement, retried with a short backoff on another
node) fires there, a tick late at most. Loads are incremental: each reads only past the end
of the previous window, so a task is read about once however often the loop runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from chronoq.clock import Clock
from chronoq.coordinator.protocols import Ownership
from chronoq.effects import Effects, Scheduled, made_ready
from chronoq.errors import ChronoqError
from chronoq.gathering import RATE_WINDOW, DueRate, gather_for
from chronoq.node.dispatch.handoff import HandOff, Plan
from chronoq.node.owner.firing import FiringAccount
from chronoq.partitionmap import PartitionMap
from chronoq.routing import id_partition
from chronoq.store.port import ByPartition, ByTaskId
from chronoq.supervision import STALL_AFTER, Loop, Supervisor
from chronoq.wheel import Due, TimingWheel

log = logging.getLogger("chronoq.firing")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: Loads per horizon: a task is in the wheel at least 3/4 of the horizon before it is due.
LOADS_PER_HORIZON = 4
#: Seconds between loads at most, whatever the horizon: a load is also the owner's proof that
#: the store answers (``last_ok``), which the store watch wants within its grace.
MAX_LOAD_EVERY = 0.5
#: Longest the fire loop sleeps without reading the clock: a clock that moves without a
#: poke (a test's ``ManualClock``) is seen this late; the virtual clock pokes at once.
MAX_SLEEP = 0.25
#: Tasks per fire statement at most (all due at once: grouped, never one statement each).
FIRE_BATCH = 2000
#: Fire statements per pass at most before the loop yields (then it runs again at once).
FIRE_ROUNDS = 10
#: A failed hand-off's tasks are given back within this many seconds or left to their leases
#: (the shortest lease is a second: past it a task may be someone else's again).
UNLEASE_WITHIN = 0.5
#: Seconds before the fire loop retries a failed pass, doubled per failure (up to the
#: supervisor's cap): its interval may be zero, which must not make an outage a busy loop.
FIRE_RETRY = 0.05


def instant_of(when: datetime) -> int:
    """``when`` as integer microseconds since the epoch: the wheel's instants."""
    return (when - _EPOCH) // _US


@dataclass
class PreciseStats:
    loads: int = 0
    loaded: int = 0  # tasks entered by loads
    offered: int = 0  # tasks entered at submit (on this node or told by another)
    statements: int = 0
    fired: int = 0
    handed_off: int = 0  # of ``fired``, leased straight to a worker stream of this node
    errors: int = 0


class WheelStore(ByPartition, ByTaskId, Protocol):
    """What the wheel asks of the store: loads and fires of its partitions, and the
    give-back of a hand-off whose outcome is unknown (by task id)."""


class PreciseFirer:
    """The owner's timing wheel and the two loops that fill and fire it."""

    def __init__(
        self,
        store: WheelStore,
        ownership: Ownership,
        clock: Clock,
        account: FiringAccount,
        *,
        partitions: PartitionMap,
        horizon: timedelta,
        capacity: int,
        node_id: str = "",
        handoff: HandOff | None = None,
        on_effects: Callable[[Effects], None] = lambda _e: None,
    ) -> None:
        self._store = store
        #: Applies what its writes did (fired tasks, a failed hand-off's given back READY):
        #: the node's dispatcher.
        self._on_effects = on_effects
        self._ownership = ownership
        self._clock = clock
        #: The owner's count of fire statements, shared with the tick.
        self._account = account
        self._partitions = partitions
        self.horizon = horizon
        self.load_every = min(horizon.total_seconds() / LOADS_PER_HORIZON, MAX_LOAD_EVERY)
        self.node_id = node_id
        #: Worker streams of this node that fired tasks may go to directly (see handoff).
        self._handoff = handoff
        self.wheel = TimingWheel(capacity)
        self.stats = PreciseStats()
        self._loaded_until: datetime | None = None  # the wheel holds what is due before this
        self._epoch = 0  # bumped by ``forget``: a load in flight then records nothing
        self._extra: set[int] = set()  # partitions to read again in full at the next load
        self._fire_wake = asyncio.Event()
        self._unleasing: set[asyncio.Task[None]] = set()
        self._load_wake = asyncio.Event()
        self._pass_started = 0.0
        self._rate = DueRate(RATE_WINDOW)
        self.last_ok = time.monotonic()  # when the last load reached the store

    # ---------------------------------------------------------------- loops

    def start(self, supervisor: Supervisor) -> list[Loop]:
        """The load and fire loops, under ``supervisor``."""
        return [
            supervisor.every(
                "wheel-load",
                self.load,
                interval=self.load_every,
                wake=self._load_wake,
                stall_after=STALL_AFTER,
            ),
            supervisor.every(
                "wheel-fire",
                self.fire,
                interval=self._fire_interval,
                retry=FIRE_RETRY,
                wake=self._fire_wake,
                stall_after=STALL_AFTER,
            ),
        ]

    def poke(self) -> None:
        """The clock jumped: look at the wheel now, and read the window again."""
        self._loaded_until = None
        self._load_wake.set()
        self._fire_wake.set()

    def forget(self, partitions: set[int]) -> None:
        """Ownership of ``partitions`` moved (lost or taken): drop what the wheel holds of
        them and read them again at once (a load in flight records nothing of them)."""
        self._epoch += 1
        dropped = self.wheel.drop_partitions(partitions)
        self._extra |= set(partitions)
        self._load_wake.set()
        if dropped:
            log.debug("wheel: dropped %d tasks of %d partitions", dropped, len(partitions))

    # ---------------------------------------------------------------- loading

    async def load(self) -> int:
        """Read the tasks due within the horizon that the wheel does not hold yet; returns how
        many entered it."""
        owned = dict(self._ownership.owned())
        # Entries of partitions no longer ours go, whoever forgot to say so.
        self.wheel.keep_partitions(owned)
        if not owned:
            self._loaded_until = None
            self._extra.clear()
            return 0  # no statement: says nothing of the store (last_ok stays)
        now = self._clock.now()
        until = now + self.horizon
        after = self._loaded_until
        if after is None or not now <= after <= until:
            after = now  # first load, or the clock jumped: the whole window
        epoch = self._epoch
        extra, self._extra = self._extra & owned.keys(), set()
        added = 0
        if extra and after > now:
            rows = await self._store.due_soon(sorted(extra), now, after, limit=self.wheel.free)
            added += self._enter(rows, owned, epoch)
        room = self.wheel.free
        rows = await self._store.due_soon(sorted(owned), after, until, limit=room)
        added += self._enter(rows, owned, epoch)
        if epoch == self._epoch and room > 0:
            # Cut short by the room: the rest of the window is read again later (ties at the
            # last instant too, which the wheel holds once).
            self._loaded_until = rows[-1][2] - _US if len(rows) >= room else until
        self.stats.loads += 1
        self.stats.loaded += added
        self.last_ok = time.monotonic()
        return added

    def _enter(
        self,
        rows: Sequence[tuple[str, int, datetime, str, str]],
        owned: Mapping[int, int],
        epoch: int,
    ) -> int:
        if epoch != self._epoch:
            # Ownership moved while we read: keep the rows of partitions held all along.
            still = self._ownership.owned()
            rows = [r for r in rows if still.get(r[1]) == owned.get(r[1])]
        return self._add(
            Due(task_id, p, instant_of(run_at), (namespace, queue))
            for task_id, p, run_at, namespace, queue in rows
        )

    def _add(self, entries: Iterable[Due]) -> int:
        first = self.wheel.next_at()
        added = sum(1 for d in entries if self.wheel.add(d.task_id, d.partition, d.at, d.key))
        nxt = self.wheel.next_at()
        if nxt is not None and (first is None or nxt < first):
            self._fire_wake.set()  # an earlier instant than the fire loop sleeps for
        return added

    # ---------------------------------------------------------------- submits

    def offer(self, scheduled: Iterable[Scheduled], now: datetime) -> list[Due]:
        """Tasks just submitted (id, run_at, (namespace, queue)): those due within the
        horizon and of an owned partition enter the wheel; returns the other near-future ones
        (for their owners, who learn id, partition and instant only)."""
        until = now + self.horizon
        partitions = self._partitions.count
        owned = self._ownership.owned()
        mine: list[Due] = []
        others: list[Due] = []
        for task_id, run_at, key in scheduled:
            if run_at > until:
                continue
            p = id_partition(uuid.UUID(task_id), partitions)
            if p in owned:
                mine.append(Due(task_id, p, instant_of(run_at), key))
            else:
                others.append(Due(task_id, p, instant_of(run_at)))
        if mine:
            self.stats.offered += self._add(mine)
        return others

    def told(self, entries: Iterable[Due], partitions: Iterable[int] | None) -> None:
        """Another node's submits: enter the entries of owned partitions; read the listed
        ``partitions`` again (a notice too large to list every task names them instead;
        None: every partition)."""
        owned = self._ownership.owned()
        self.stats.offered += self._add(d for d in entries if d.partition in owned)
        wanted = set(owned) if partitions is None else {p for p in partitions if p in owned}
        if wanted:
            self._extra |= wanted
            self._load_wake.set()

    # ---------------------------------------------------------------- firing

    def _settle_late(self, plan: Plan, now: datetime, statement: asyncio.Future[Any]) -> None:
        """A handing-off statement whose pass failed or was cancelled: deliver what it leased
        when it did finish; when it failed, its outcome is unknown (the commit may have
        landed), so the tasks it may have leased are given back, no attempt used."""
        if statement.cancelled() or statement.exception() is not None:
            plan.cancel()
            job = asyncio.get_running_loop().create_task(
                self._unlease(plan.leases, now), name="chronoq-handoff-unlease"
            )
            self._unleasing.add(job)
            job.add_done_callback(self._unleasing.discard)
        else:
            self.stats.handed_off += plan.settle(statement.result().leased)

    async def _unlease(self, leases: Mapping[str, str], now: datetime) -> None:
        try:
            async with asyncio.timeout(UNLEASE_WITHIN):
                ready = await self._store.release_handed(leases, now, self._clock.now())
        except (ChronoqError, TimeoutError) as exc:
            log.warning(
                "could not give back %d tasks of a failed hand-off (their leases expire): %s",
                len(leases),
                exc,
            )
            return
        if ready:
            self._on_effects(made_ready(ready))

    def _fire_interval(self) -> float:
        """Seconds from the last pass's start to the next: until the wheel's first instant,
        and no sooner than ``gather_for`` allows."""
        elapsed = time.monotonic() - self._pass_started
        nxt = self.wheel.next_at()
        if nxt is None:
            return elapsed + self.load_every  # an entry that arrives wakes the loop
        wait = (nxt - instant_of(self._clock.now())) / 1e6
        return max(self._gather(), elapsed + min(MAX_SLEEP, max(0.0, wait)))

    def _gather(self) -> float:
        """Seconds the next statement gathers for at the current due rate (``gather_for``)."""
        return gather_for(self._rate.per_second(time.monotonic()))

    async def fire(self) -> None:
        """Fire what the wheel holds that is due now, in statements of up to FIRE_BATCH;
        what came due meanwhile goes in the next statement at once, unless the last one was
        busy (the next pass then waits, see ``chronoq.gathering``)."""
        self._pass_started = time.monotonic()
        for _ in range(FIRE_ROUNDS):
            now = self._clock.now()
            due = self.wheel.pop_due(instant_of(now), FIRE_BATCH)
            if not due:
                return
            self._rate.add(len(due), time.monotonic())
            try:
                await self._fire(due, now)
            except Exception:
                self.stats.errors += 1
                raise  # what it held is still SCHEDULED: the tick fires it
            if len(due) < FIRE_BATCH and self._gather():
                return  # busy, but no backlog: the next statement gathers first

    async def _fire(self, due: Sequence[Due], now: datetime) -> None:
        async with self._ownership.gate:
            owned = self._ownership.owned()
            mine = [d for d in due if d.partition in owned]
            if not mine:
                return
            fences = {d.partition: owned[d.partition] for d in mine}
            plan = self._handoff.plan(mine) if self._handoff is not None else None
            statement = asyncio.ensure_future(
                self._store.fire_listed(
                    fences,
                    now,
                    [d.task_id for d in mine],
                    node_id=self.node_id,
                    leases=plan.leases if plan is not None else None,
                    budgets=plan.budgets if plan is not None else None,
                )
            )
            try:
                # Shielded when it hands off: whatever it leased must reach its stream or go
                # back, even if this pass is cancelled meanwhile.
                result = await (asyncio.shield(statement) if plan is not None else statement)
            except BaseException:
                if plan is not None:
                    statement.add_done_callback(functools.partial(self._settle_late, plan, now))
                raise
        if plan is not None:
            self.stats.handed_off += plan.settle(result.leased)
        self.stats.statements += 1
        self.stats.fired += result.fired
        self._account.add(result)
        if result.ready_by_queue:
            self._on_effects(result.effects)
