"""Summary statistics every chronoq report shares, so one p99 means one thing everywhere.

Pure: no I/O, no clocks. The percentile is the nearest-rank definition: the smallest sample
such that at least ``p`` percent of the samples are less than or equal to it. It is always one
of the samples (never an interpolation), so a p99 of 100 samples is the 99th smallest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparisonT

_RANK_DIGITS = 9
"""Round ``p / 100 * n`` first: 0.99 * 100 is 99.00000000000001, whose ceiling is 100."""


def rank(count: int, p: float) -> int:
    """The 1-based nearest rank of the ``p``-th percentile (0..100) among ``count`` samples."""
    if count < 1:
        raise ValueError("no samples")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside 0..100")
    return min(count, max(1, math.ceil(round(p / 100 * count, _RANK_DIGITS))))


def percentile(
    samples: Iterable[SupportsRichComparisonT], p: float
) -> SupportsRichComparisonT | None:
    """The nearest-rank ``p``-th percentile (0..100) of ``samples``; None when there are none."""
    ordered = sorted(samples)
    if not ordered:
        return None
    return ordered[rank(len(ordered), p) - 1]
