"""The published loads: which partitions' coming work moves them between members, and when.

Pure: no I/O. The leading node counts per partition the tasks of the ``coming`` window: the
buckets from the current one on, but only the tasks due after the count's instant. Overdue
tasks still waiting are a backlog, not coming work: they pile up on the partitions of an owner
that fires slowly (its store links are slow), and weighing them would hand those partitions
off, a pause of each, just when the store is slow and the move helps nothing. ``due_loads``
rounds the counts so that small drifts move nothing, and ``worth_publishing`` says whether the
new loads should reach etcd (``ring.assign`` weighs them): only when the current assignment
would overload a member with them well past the ring's slack (``OVERLOAD_SLACK``), or when
loads published before are all gone. Publishing less often keeps the assignment, and so the
owners, still.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from chronoq.buckets import bucket_of
from chronoq.coordinator import ring

#: How many times the ring's slack a member must be above the mean before new loads move
#: partitions. ``assign`` fills members up to ``(1 + epsilon)`` times the mean, so judging by
#: that same bound would find a member over it after nearly every count (the counts of a few
#: tasks a partition drift by a power of two from one count to the next) and hand partitions
#: off for noise; a hot bucket passes the wider bound all the same.
OVERLOAD_SLACK = 2.0


@dataclass(frozen=True)
class Window:
    """The tasks the loads weigh: SCHEDULED ones of buckets ``first..last`` due after ``after``."""

    first: int
    last: int
    after: datetime

    def holds(self, run_at: datetime, bucket_seconds: int) -> bool:
        """Whether a pending task due at ``run_at`` counts (the store's count agrees)."""
        return run_at > self.after and self.first <= bucket_of(run_at, bucket_seconds) <= self.last


def coming(now: datetime, bucket_seconds: int, horizon_buckets: int) -> Window:
    """The ``horizon_buckets`` buckets from the one holding ``now``, without what is overdue."""
    current = bucket_of(now, bucket_seconds)
    return Window(current, current + horizon_buckets - 1, now)


def quantize(n: float) -> float:
    """Round a due count to a power of two, so small drifts do not move partitions."""
    return float(2 ** round(math.log2(n))) if n >= 1 else 0.0


def due_loads(counts: Mapping[tuple[int, int], int]) -> dict[int, float]:
    """Per-partition due work from (partition, bucket) → count, rounded (``quantize``)."""
    summed: dict[int, float] = {}
    for (part, _b), count in counts.items():
        summed[part] = summed.get(part, 0.0) + count
    return {part: quantize(count) for part, count in summed.items() if count > 0}


def worth_publishing(
    fresh: Mapping[int, float],
    published: Mapping[int, float],
    assignment: Mapping[int, str],
    partitions: Iterable[int],
    members: int,
    epsilon: float,
) -> bool:
    """Whether ``fresh`` loads should replace the ``published`` ones: they differ, and with
    them the current ``assignment`` puts a member above the ring's capacity at
    ``OVERLOAD_SLACK`` times its slack, or no partition is hot any more while some were
    published as hot."""
    if fresh == published:
        return False
    weights = {p: ring.BASE_WEIGHT + fresh.get(p, 0.0) for p in partitions}
    cap = ring.capacity(math.fsum(weights.values()), members, OVERLOAD_SLACK * epsilon)
    per_member: dict[str, list[float]] = {}
    for part, member in assignment.items():
        per_member.setdefault(member, []).append(weights[part])
    overloaded = any(math.fsum(ws) > cap for ws in per_member.values())
    stale_hot = bool(published) and not fresh
    return overloaded or stale_hot
