"""Firing lateness: a bounded window of recent samples and running totals (no growth)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


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
        """The ``p``-th percentile (0..100) of the window; 0 when empty."""
        if not self._samples:
            return 0.0
        ordered = sorted(self._samples)
        index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
        return ordered[index]
