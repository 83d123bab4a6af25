"""Counts by queue that the partition owners keep: what a store shard answers, how shards'
answers merge, and the answer a caller gets. Pure.

Each owner recounts its partitions from an index every few seconds and writes one row per
(partition, namespace, state, queue); a call sums those rows, so its cost follows the number
of partitions and queues, never the number of tasks. An answer is as fresh as the oldest
partition count it summed (``as_of``); partitions no owner has counted yet are named
(``uncounted_partitions``), never silently missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from chronoq.models import TaskState

#: The states kept (those of the recount's index): the live ones and the dead letters.
KEPT_STATES = (TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING, TaskState.DEAD)
#: The queue name of the row a recount sums a partition's queues past its cap into (no
#: queue has an empty name).
REST = ""


@dataclass(frozen=True)
class StateCounts:
    """Tasks in each kept state."""

    scheduled: int = 0
    ready: int = 0
    running: int = 0
    dead: int = 0

    @classmethod
    def of(cls, by_state: Mapping[TaskState, int]) -> StateCounts:
        return cls(
            scheduled=by_state.get(TaskState.SCHEDULED, 0),
            ready=by_state.get(TaskState.READY, 0),
            running=by_state.get(TaskState.RUNNING, 0),
            dead=by_state.get(TaskState.DEAD, 0),
        )

    def __add__(self, other: StateCounts) -> StateCounts:
        return StateCounts(
            self.scheduled + other.scheduled,
            self.ready + other.ready,
            self.running + other.running,
            self.dead + other.dead,
        )

    def __sub__(self, other: StateCounts) -> StateCounts:
        return StateCounts(
            max(0, self.scheduled - other.scheduled),
            max(0, self.ready - other.ready),
            max(0, self.running - other.running),
            max(0, self.dead - other.dead),
        )

    @property
    def total(self) -> int:
        return self.scheduled + self.ready + self.running + self.dead


@dataclass(frozen=True)
class QueueTally:
    """One queue's counts, and the ``run_at`` of its oldest READY task (None: none ready)."""

    queue: str
    counts: StateCounts
    oldest_ready_at: datetime | None = None


@dataclass(frozen=True)
class LabelTally:
    """Tasks of one queue whose label (the key asked for) has ``value`` ("" : no such label)."""

    queue: str
    value: str
    counts: StateCounts


@dataclass(frozen=True)
class QueueSnapshot:
    """A namespace's counts by queue, as kept by the owners.

    ``queues``: the answered queues in queue order; ``other``: the queues past them, summed
    (``truncated`` when there were some); ``totals``: every queue. ``as_of``: the oldest
    partition count summed (None: no partition counted yet), ``ready_as_of`` that of its
    READY and RUNNING counts, which the owners recount more often (their index entries are
    few, whatever the backlog); ``now``: the node's clock when
    it answered, which ``oldest_ready_age`` is measured from. ``labels``: per label value,
    when a label key was asked for; read from the tasks up to a bound, so with
    ``labels_capped`` they are lower bounds.
    """

    queues: tuple[QueueTally, ...]
    other: StateCounts
    totals: StateCounts
    truncated: bool
    as_of: datetime | None
    now: datetime
    uncounted_partitions: int = 0
    labels: tuple[LabelTally, ...] = ()
    labels_capped: bool = False
    ready_as_of: datetime | None = None

    def queue(self, name: str) -> QueueTally | None:
        return next((t for t in self.queues if t.queue == name), None)

    def oldest_ready_age(self, name: str) -> timedelta | None:
        """How long the oldest READY task of queue ``name`` has been due (None: none)."""
        tally = self.queue(name)
        if tally is None or tally.oldest_ready_at is None:
            return None
        return max(timedelta(0), self.now - tally.oldest_ready_at)

    @property
    def staleness(self) -> timedelta | None:
        """How old the oldest count in this answer is (None: nothing counted yet)."""
        return None if self.as_of is None else max(timedelta(0), self.now - self.as_of)


@dataclass
class KeptCounts:
    """What one store shard keeps of a namespace: sums per (queue, state) of the partitions
    it holds (``REST``: queues past a partition's cap), totals per state, the oldest count
    among them and how many partitions it counted, and the oldest READY ``run_at`` of the
    queues it probed."""

    rows: dict[tuple[str, TaskState], int] = field(default_factory=dict)
    totals: dict[TaskState, int] = field(default_factory=dict)
    as_of: datetime | None = None
    counted: int = 0
    oldest_ready: dict[str, datetime] = field(default_factory=dict)
    live_as_of: datetime | None = None


def merged(answers: Iterable[KeptCounts]) -> KeptCounts:
    """The shards' answers as one (sums, the oldest count, the earliest READY task)."""
    out = KeptCounts()
    for a in answers:
        for key, n in a.rows.items():
            out.rows[key] = out.rows.get(key, 0) + n
        for state, n in a.totals.items():
            out.totals[state] = out.totals.get(state, 0) + n
        if a.as_of is not None and (out.as_of is None or a.as_of < out.as_of):
            out.as_of = a.as_of
        if a.live_as_of is not None and (out.live_as_of is None or a.live_as_of < out.live_as_of):
            out.live_as_of = a.live_as_of
        out.counted += a.counted
        for queue, at in a.oldest_ready.items():
            if queue not in out.oldest_ready or at < out.oldest_ready[queue]:
                out.oldest_ready[queue] = at
    return out


def snapshot(
    kept: KeptCounts,
    *,
    now: datetime,
    partitions: int,
    max_queues: int,
    queues: Sequence[str] = (),
) -> QueueSnapshot:
    """The answer from what the shards keep: the first ``max_queues`` queues in queue order
    (only ``queues`` when named, each answered even at zero), the rest summed in ``other``."""
    by_queue: dict[str, dict[TaskState, int]] = {}
    for (queue, state), n in kept.rows.items():
        if queue != REST:
            by_queue.setdefault(queue, {})[state] = n
    names = sorted(set(queues)) if queues else sorted(by_queue)
    answered = names[:max_queues]
    tallies = tuple(
        QueueTally(q, StateCounts.of(by_queue.get(q, {})), kept.oldest_ready.get(q))
        for q in answered
    )
    totals = StateCounts.of(kept.totals)
    listed = sum((t.counts for t in tallies), StateCounts())
    return QueueSnapshot(
        queues=tallies,
        other=totals - listed if not queues else StateCounts(),
        totals=totals if not queues else listed,
        truncated=len(names) > len(answered) or (not queues and REST in {k[0] for k in kept.rows}),
        as_of=kept.as_of,
        now=now,
        uncounted_partitions=max(0, partitions - kept.counted),
        ready_as_of=kept.live_as_of,
    )


def label_tallies(
    rows: Iterable[tuple[str, str, TaskState, int]], max_rows: int
) -> tuple[tuple[LabelTally, ...], bool]:
    """(queue, value, state, n) rows (several shards' alike) as tallies in (queue, value)
    order, at most ``max_rows``; True when some were left out."""
    sums: dict[tuple[str, str], dict[TaskState, int]] = {}
    for queue, value, state, n in rows:
        by_state = sums.setdefault((queue, value), {})
        by_state[state] = by_state.get(state, 0) + n
    keys = sorted(sums)
    tallies = tuple(LabelTally(q, v, StateCounts.of(sums[q, v])) for q, v in keys[:max_rows])
    return tallies, len(keys) > max_rows
