"""Which time ranges a shard's history still lacks: pure, no I/O.

``task_history`` is ranged by ``retire_at`` in slices (half-open ``[lo, hi)``). A move copies
history rows to a shard whose slices may have other bounds (another width, made by another
node): the target must cover every range the copied rows need, without a new slice
overlapping one it has (PostgreSQL refuses overlapping partitions). ``uncovered`` answers
which pieces to create: the parts of the wanted ranges that no existing slice covers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

#: A slice's bounds: ``[lo, hi)``.
Range = tuple[datetime, datetime]


def merged(ranges: Iterable[Range]) -> list[Range]:
    """``ranges`` sorted, with overlapping or touching ones joined; empty ones dropped."""
    out: list[Range] = []
    for lo, hi in sorted(r for r in ranges if r[0] < r[1]):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def uncovered(wanted: Iterable[Range], existing: Sequence[Range]) -> list[Range]:
    """The pieces of ``wanted`` that no range of ``existing`` covers, sorted and disjoint
    from each other and from ``existing`` (each one a slice to create)."""
    have = merged(existing)
    out: list[Range] = []
    for lo, hi in merged(wanted):
        at = lo
        for h_lo, h_hi in have:
            if h_hi <= at:
                continue
            if h_lo >= hi:
                break
            if h_lo > at:
                out.append((at, h_lo))
            at = max(at, h_hi)
            if at >= hi:
                break
        if at < hi:
            out.append((at, hi))
    return out
