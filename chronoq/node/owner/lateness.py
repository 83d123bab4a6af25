"""Firing lateness: a bounded window of recent samples and running totals (no growth)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from chronoq import stats


class LatenessWindow:
    """The last ``size`` lateness samples in seconds, for percentiles in status and the lab."""

    def __init__(self, size: int = 20_000) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self.count = 0
        self.max = 0.0

    def add(self, samples: Iterable[float]) -> None:
        for s in samples:
            self._samples.append(s)
            self.count += 1
            self.max = max(self.max, s)

    def percentile(self, p: float) -> float:
        """The ``p``-th percentile (0..100, ``chronoq.stats``) of the window; 0 when empty."""
        return stats.percentile(self._samples, p) or 0.0
