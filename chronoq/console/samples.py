"""The last minutes of the cluster, from ``Status`` polls: throughput, lateness, backlog.

A node reports counters (tasks fired since it started) and lateness percentiles; the console
polls every few seconds and keeps a fixed ring of samples, from which it derives fired/s per
node and for the cluster. Pure: the caller passes the samples with their times.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: Samples kept by default: ten minutes at one poll every two seconds.
DEFAULT_SAMPLES = 300
#: Upper bound on the samples a ring keeps, whatever is asked.
MAX_SAMPLES = 10_000


@dataclass(frozen=True)
class NodeSample:
    node_id: str
    fired_total: int
    lateness_p50_ms: float
    lateness_p99_ms: float


@dataclass(frozen=True)
class Sample:
    """One poll: its time (Unix seconds), the pending tasks of the coming buckets, the nodes."""

    at: float
    pending: int
    nodes: tuple[NodeSample, ...] = field(default_factory=tuple)

    def node(self, node_id: str) -> NodeSample | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)


def fired_rate(before: NodeSample | None, after: NodeSample, seconds: float) -> float | None:
    """Fired/s of a node between two samples; None when it cannot be told (no earlier sample,
    no time between them, or the counter went back: the node restarted)."""
    if before is None or seconds <= 0 or after.fired_total < before.fired_total:
        return None
    return (after.fired_total - before.fired_total) / seconds


@dataclass(frozen=True)
class Series:
    """Columns for charts: times, cluster fired/s, worst p50 and p99 lateness, pending."""

    at: list[float]
    fired_per_s: list[float | None]
    lateness_p50_ms: list[float | None]
    lateness_p99_ms: list[float | None]
    pending: list[int]


class SampleRing:
    """The last ``size`` samples, oldest first."""

    def __init__(self, size: int = DEFAULT_SAMPLES) -> None:
        self._samples: deque[Sample] = deque(maxlen=max(2, min(size, MAX_SAMPLES)))

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: Sample) -> None:
        """Keep ``sample``; one older than the newest kept is dropped (polls race)."""
        if self._samples and sample.at <= self._samples[-1].at:
            return
        self._samples.append(sample)

    @property
    def samples(self) -> Sequence[Sample]:
        return tuple(self._samples)

    def node_rates(self) -> dict[str, float | None]:
        """Fired/s of each node of the newest sample, over the last interval."""
        if not self._samples:
            return {}
        last = self._samples[-1]
        before = self._samples[-2] if len(self._samples) > 1 else None
        seconds = last.at - before.at if before is not None else 0.0
        return {
            n.node_id: fired_rate(before.node(n.node_id) if before else None, n, seconds)
            for n in last.nodes
        }

    def series(self) -> Series:
        samples = list(self._samples)
        rates: list[float | None] = [None]
        for before, after in itertools.pairwise(samples):
            rates.append(cluster_rate(before, after))
        return Series(
            at=[s.at for s in samples],
            fired_per_s=rates[: len(samples)],
            lateness_p50_ms=[_worst(n.lateness_p50_ms for n in s.nodes) for s in samples],
            lateness_p99_ms=[_worst(n.lateness_p99_ms for n in s.nodes) for s in samples],
            pending=[s.pending for s in samples],
        )


def cluster_rate(before: Sample, after: Sample) -> float | None:
    """Fired/s of the whole cluster between two samples: the sum over the nodes that are in
    both with a counter that did not go back; None when no node is."""
    seconds = after.at - before.at
    rates = [fired_rate(before.node(n.node_id), n, seconds) for n in after.nodes]
    known = [r for r in rates if r is not None]
    return sum(known) if known else None


def _worst(values: Iterable[float]) -> float | None:
    return max(values, default=None)
