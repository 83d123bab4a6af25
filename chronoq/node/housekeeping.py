"""Background duties of a node besides firing: retention, health and queue depth."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta

from chronoq.buckets import bucket_of
from chronoq.cardinality import DEFAULT_METRICS_QUEUES, top_queues
from chronoq.clock import Clock
from chronoq.coordinator.protocols import Ownership
from chronoq.history_slices import slice_width
from chronoq.models import TaskState
from chronoq.partitionmap import PartitionMap
from chronoq.store.port import ByPartition, Reachable
from chronoq.supervision import Loop, Supervisor

log = logging.getLogger("chronoq.node")

#: Batches one retention pass runs at most per rule: a pass is bounded in time even when the
#: backlog is not (the next pass goes on), e.g. 2,000 x 1,000 rows a minute.
MAX_BATCHES = 2000
#: The pause between two batches, which leaves the firing loop its share of the store.
BATCH_PAUSE_S = 0.05


class Retention:
    """Keeps the store small, in three steps a pass, oldest first and in small batches:

    1. the history's time slices (``keep_history``): those whose every row is past its
       retention dropped whole, those the next rows need made ahead;
    2. the sweep (``retire_finished``): SUCCEEDED, CANCELLED and SKIPPED tasks of owned
       partitions finished ``history_after`` ago move into the history (rows already past
       ``retention`` are deleted only); DEAD letters and rows holding a unique window stay;
    3. DEAD letters past ``dead_retention`` purged row by row (``purge_finished``).

    It never takes the owner gate and pauses between batches, so firing is never held up.
    An idempotency key answers its first task until that task's slice is dropped, then it
    can be reused.
    """

    def __init__(
        self,
        store: ByPartition,
        ownership: Ownership,
        clock: Clock,
        *,
        retention: timedelta | None,
        dead_retention: timedelta | None,
        interval: float,
        batch: int,
        history_after: timedelta = timedelta(seconds=60),
        history_slice: timedelta | None = None,
        on_purged: Callable[[int], None] = lambda _n: None,
        on_retired: Callable[[int], None] = lambda _n: None,
        on_slices_dropped: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self._store = store
        self._ownership = ownership
        self._clock = clock
        self._retention = retention
        self._dead_retention = dead_retention
        self._history_after = history_after
        self._width = slice_width(retention, history_slice)
        self._interval = interval
        self._batch = batch
        self._on_purged = on_purged
        self._on_retired = on_retired
        self._on_slices_dropped = on_slices_dropped
        self.purged = 0  # rows deleted: DEAD letters, and finished rows past their retention
        self.retired = 0  # finished rows moved into the history
        self.slices_dropped = 0

    def start(self, supervisor: Supervisor) -> Loop:
        """Run every ``interval`` seconds; firing does not depend on it (not critical)."""
        return supervisor.every(
            "retention", self.purge, interval=self._interval, initial_delay=True, critical=False
        )

    async def purge(self) -> int:
        """One pass (the three steps); the rows that left ``tasks``."""
        upkeep = await self._store.keep_history(
            self._clock.now(), retention=self._retention, width=self._width
        )
        self.slices_dropped += upkeep.dropped
        self._on_slices_dropped(upkeep.dropped)
        partitions = sorted(self._ownership.owned())
        total = await self.sweep(partitions)
        if self._dead_retention is not None:
            before = self._clock.now() - self._dead_retention
            for _ in range(MAX_BATCHES):
                n = await self._store.purge_finished(
                    partitions, (TaskState.DEAD,), before, self._batch
                )
                total += n
                self.purged += n
                self._on_purged(n)
                if n < self._batch:
                    break
                await asyncio.sleep(BATCH_PAUSE_S)
        return total

    async def sweep(self, partitions: list[int]) -> int:
        """The finished rows of ``partitions`` into the history, batch after batch."""
        total = 0
        for _ in range(MAX_BATCHES):
            now = self._clock.now()
            done = await self._store.retire_finished(
                partitions,
                now - self._history_after,
                now,
                retention=self._retention,
                width=self._width,
                batch=self._batch,
            )
            total += done.gone
            self.retired += done.kept
            self.purged += done.gone - done.kept
            self._on_retired(done.kept)
            self._on_purged(done.gone - done.kept)
            if done.gone < self._batch:
                break
            await asyncio.sleep(BATCH_PAUSE_S)
        return total


class CounterRecount:
    """Recounts the namespace counters a store of shards keeps on shard-0 (schedules and
    their reserved rate), on the node that ``leads`` only: a pass at start and every
    ``interval`` seconds, each bounded by the store (``RECOUNT_BATCH`` namespaces, those a
    create of unknown outcome left over-counted first). Nothing else depends on it: an
    over-count refuses more creates until it runs, never allows more (not critical)."""

    def __init__(
        self,
        recount: Callable[[datetime], Awaitable[int]],
        clock: Clock,
        *,
        leads: Callable[[], bool],
        interval: float = 60.0,
    ) -> None:
        self._recount = recount
        self._clock = clock
        self._leads = leads
        self._interval = interval
        self.recounted = 0

    def start(self, supervisor: Supervisor) -> Loop:
        return supervisor.every(
            "counter-recount", self.run, interval=self._interval, critical=False
        )

    async def run(self) -> int:
        if not self._leads():
            return 0
        done = await self._recount(self._clock.now())
        self.recounted += done
        return done


#: The most of its time a node spends counting the queue depth: its SCHEDULED part reads
#: every task of the coming hour, which grows with the submit rate (``paced_interval``).
DEPTH_SHARE = 0.01


class DepthPoller:
    """Keeps the latest queue depth for the metrics endpoint (polled, never on a scrape).

    The depth is the cluster's, so one node counts it (the one that ``leads``, see
    ``Ownership.leads``) and the others export none: its SCHEDULED part reads every task of
    the coming hour, which every node counting again would multiply by their number.
    """

    def __init__(
        self,
        store: ByPartition,
        clock: Clock,
        *,
        partitions: PartitionMap,
        interval: float = 15.0,
        leads: Callable[[], bool] = lambda: True,
        queues: int = DEFAULT_METRICS_QUEUES,
    ) -> None:
        self._store = store
        self._partitions = partitions
        self._clock = clock
        self._interval = interval
        self._leads = leads
        self._queues = queues
        self.depth: dict[tuple[str, str, str], int] = {}

    def start(self, supervisor: Supervisor) -> Loop:
        """Poll every ``interval`` seconds; only metrics depend on it (not critical)."""
        return supervisor.every(
            "depth", self.poll, interval=self._interval, critical=False, share=DEPTH_SHARE
        )

    async def poll(self) -> dict[tuple[str, str, str], int]:
        if not self._leads():
            self.depth = {}  # another node counts (a figure of ours would go stale)
            return self.depth
        now = bucket_of(self._clock.now(), self._store.bucket_seconds)
        horizon = max(1, 3600 // self._store.bucket_seconds)
        depth = await self._store.queue_depth(self._partitions.all, now - 1, now + horizon)
        # Bounded here, once a poll, so a scrape never pays for how many queues exist.
        self.depth = top_queues(depth, self._queues)
        return self.depth


class HealthWatch:
    """SERVING while the node owns at least part of what it should and every critical loop
    works; NOT_SERVING otherwise (its lease is gone, it cannot take the partitions assigned
    to it, or a loop such as firing died or keeps failing)."""

    def __init__(
        self,
        ownership: Ownership,
        set_serving: Callable[[bool], Awaitable[None]],
        *,
        loop_problems: Callable[[], list[str]] = list,
        interval: float = 0.5,
    ) -> None:
        self._ownership = ownership
        self._set_serving = set_serving
        self._loop_problems = loop_problems
        self._interval = interval
        self.serving: bool | None = None

    def problems(self) -> list[str]:
        """Why the node should not serve; empty when it should."""
        found = list(self._loop_problems())
        if self._ownership.suspended:  # e.g. cut off from PostgreSQL: its API cannot answer
            found.append("ownership suspended: partitions handed to the other nodes")
        expected = self._ownership.expected()
        if expected and not expected & set(self._ownership.owned()):
            found.append(f"owns none of the {len(expected)} partitions assigned to it")
        return found

    def healthy(self) -> bool:
        return not self.problems()

    def start(self, supervisor: Supervisor) -> Loop:
        return supervisor.every("health", self.check, interval=self._interval)

    async def check(self) -> bool:
        problems = self.problems()
        now = not problems
        if now != self.serving:
            self.serving = now
            await self._set_serving(now)
            log.info("health: %s", "SERVING" if now else f"NOT_SERVING ({'; '.join(problems)})")
        return now


#: Share of the grace after which a store watch whose firing has not reached the store asks
#: the store itself (a trivial query): a slow tick is not a store out of reach.
PROBE_AFTER = 0.25
#: Shortest deadline of that probe (a round trip or two on a slow link).
MIN_PROBE_S = 0.1
#: Pause before the probe is made again after a failure within its deadline.
RETRY_PROBE_S = 0.02
#: Probes of the store watch in flight at most (one may hang on a dying connection).
MAX_PROBES = 2


def probe_budget(firing_stale: float, reached_stale: float, grace: float) -> float | None:
    """How long the store watch's own probe may take when firing last reached the store
    ``firing_stale`` seconds ago and anything (firing or a probe) ``reached_stale`` seconds
    ago (None: no probe, the firing's answers are fresh enough).

    Pure. The probe starts at ``PROBE_AFTER`` of the grace and never runs past the grace
    (but for ``MIN_PROBE_S``): a node cut off from the store still steps out at the grace and
    a check interval, as without the probe; at most half the grace, so two tries fit."""
    if firing_stale <= grace * PROBE_AFTER:
        return None
    return max(MIN_PROBE_S, min(grace / 2, grace - reached_stale))


def store_reached(last_ok: float, answered: float) -> float:
    """When (monotonic) this node last reached the store: by an owner statement or by the
    watch's own probe, whichever came later. Slow is not down: a store that answers the
    probe while a tick waits on a slow or reset link keeps the node in the ring."""
    return max(last_ok, answered)


class StoreWatch:
    """Hands the partitions to other nodes while this one cannot reach PostgreSQL.

    A node cut off from the store but not from etcd would otherwise keep renewing its lease
    and hold partitions that nobody fires. When neither a firing tick nor the watch's own
    probe has reached the store for ``grace`` seconds and another member still reaches it
    (``reachable_elsewhere``), the ownership is suspended (partitions released); once the
    store answers again, it resumes.

    The probe (``probe_budget``): firing statements that wait on a slow link (latency, a
    bandwidth cap, connections reset under them) leave the last tick's answer old although
    the store answers; stepping out then and rejoining a second later hands every partition
    off twice, on links equally slow for the members that take them. So past a quarter of
    the grace the watch asks the store itself, within what is left of the grace; an answer
    counts as reaching it (``store_reached``). A store out of reach answers no probe.

    Over shards, the watch's probe asks whether any shard answers (``probe_any``): a shard
    that is down for everyone stops its own partitions (``chronoq.node.shards``), and a node
    that still reaches another shard is not cut off from the store; taking the failing ticks
    of one dead shard for that made nodes leave the ring and hand off the partitions of the
    shards that were fine. A node that is out rejoins once every shard answers (``probe``),
    as the shard watch wants of a node cut off from one shard.

    When nobody reaches the store (it is down, or failing over to a standby), handing the
    partitions around helps no one and costs a rejoin once it is back: the node keeps them.
    Its owner writes stay fenced, so keeping them is safe; firing resumes with the store.
    """

    def __init__(
        self,
        store: Reachable,
        ownership: Ownership,
        last_ok: Callable[[], float],
        *,
        grace: float,
        interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        may_resume: Callable[[], bool] = lambda: True,
        reachable_elsewhere: Callable[[], bool] = lambda: True,
    ) -> None:
        self._store = store
        self._ownership = ownership
        self._last_ok = last_ok
        self._reachable_elsewhere = reachable_elsewhere
        self.holding = False  # past grace, but nobody reaches the store: partitions kept
        self._may_resume = may_resume  # another reason to stay out (a wrong clock) may hold
        self._grace = grace
        self._interval = interval
        self._monotonic = monotonic
        self.answered = 0.0  # monotonic time of the watch's own last answered probe
        self.suspensions = 0
        self.probes = 0  # probes made because firing had not reached the store for a while
        self.slow = 0  # of those, answered: the store was slow, not out of reach
        #: Probes in flight, each with its deadline (monotonic).
        self._probing: dict[asyncio.Task[float | None], float] = {}

    def start(self, supervisor: Supervisor) -> Loop:
        return supervisor.every(
            "store-watch", self.check, interval=self._interval, initial_delay=True
        )

    async def check(self) -> None:
        if self._ownership.suspended:
            if self._may_resume() and await self._store.probe():
                self.answered = self._monotonic()
                await self._ownership.resume()
            return
        stale = self._monotonic() - store_reached(self._last_ok(), self.answered)
        if stale > self._grace:
            if not self._reachable_elsewhere():
                if not self.holding:
                    log.warning(
                        "the store is out of reach from every node: keeping the partitions "
                        "(fenced) so that firing resumes as soon as it answers"
                    )
                self.holding = True
                return
            self.holding = False
            self.suspensions += 1
            await self._ownership.suspend()
            return
        self.holding = False
        budget = probe_budget(self._monotonic() - self._last_ok(), stale, self._grace)
        if budget is not None:
            await self._probe(budget)

    async def _probe(self, budget: float) -> None:
        """Ask the store, waiting at most ``budget``. A probe still unanswered then is left
        running and looked at by the next checks: over a cut link even the driver's cancel
        of a timed-out query hangs, and the watch must not hang with it. One past its own
        deadline (stuck on a connection the link is resetting) does not hold back a fresh
        one on another connection; ``MAX_PROBES`` at most are in flight."""
        now = self._monotonic()
        if len(self._probing) < MAX_PROBES and all(due < now for due in self._probing.values()):
            self.probes += 1
            task = asyncio.create_task(self._ask(budget))
            task.add_done_callback(_retrieved)
            self._probing[task] = now + budget
        done, _pending = await asyncio.wait(
            set(self._probing), timeout=budget, return_when=asyncio.FIRST_COMPLETED
        )
        for task in done:
            del self._probing[task]
            answered = None if task.cancelled() or task.exception() else task.result()
            if answered is not None:
                self.answered = max(self.answered, answered)
                self.slow += 1

    async def _ask(self, budget: float) -> float | None:
        """When (monotonic) the store answered a probe, or None. A probe that failed at once
        (its connection reset by a lossy link) is made again on a new connection while the
        budget lasts: a reset link answers, a cut one stays silent."""
        deadline = self._monotonic() + budget
        while True:
            if await self._store.probe_any(max(MIN_PROBE_S, deadline - self._monotonic())):
                return self._monotonic()
            if deadline - self._monotonic() < MIN_PROBE_S:
                return None
            await asyncio.sleep(RETRY_PROBE_S)

    def close(self) -> None:
        """Cancel the probes still in flight (the node stops)."""
        for task in self._probing:
            task.cancel()
        self._probing.clear()


def _retrieved(task: asyncio.Task[float | None]) -> None:
    if not task.cancelled():
        task.exception()  # a probe's failure is its answer: no answer


def reachable_elsewhere(
    stats: Mapping[str, Mapping[str, float]],
    me: str,
    now: float,
    fresh: float,
    *,
    after: float = 0.0,
) -> bool:
    """Whether a member other than ``me`` reached the store within ``fresh`` seconds of
    ``now`` and later than ``after``, by the ``store_ok_at`` (epoch seconds) each member
    publishes with its stats. ``after``: when this node last reached it; an answer from
    before then only says the others had not noticed yet (they lost it when this node did)."""
    for member, figures in stats.items():
        at = figures.get("store_ok_at")
        if member != me and isinstance(at, int | float) and now - at <= fresh and at > after:
            return True
    return False
