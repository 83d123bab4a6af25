"""The time slices of the task history: which to create, which to drop (pure, no I/O).

``task_history`` is ranged by ``retire_at`` (migration 0022), so retention drops a whole slice
once its upper bound has passed instead of deleting rows one by one. A slice is a half-open
range ``[lo, hi)`` of epoch seconds; slices are aligned to multiples of their width since the
epoch, so every node that uses one width computes the same bounds. Two nodes configured with
different widths must still never make overlapping slices (PostgreSQL refuses them): a new
slice is clipped to the gaps that the existing ones leave.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from chronoq.errors import ConfigError

#: The most time slices a retention window may need (retention / width, plus the two ends).
#: Every read of the history (a task by id, a keyed submit's check) locks each slice and its
#: four indexes: 64 slices keep that near 320 locks a statement, well inside PostgreSQL's
#: shared lock table (max_locks_per_transaction x connections).
MAX_SLICES = 64
#: The longest a finished task may wait in the live table before it moves to the history.
MAX_HISTORY_AFTER = timedelta(days=7)
#: The narrowest slice allowed (tests use a few seconds; a deployment hours or a day).
MIN_WIDTH = timedelta(seconds=1)
#: The widest slice allowed (a year): bounds stay well inside PostgreSQL's timestamps.
MAX_WIDTH = timedelta(days=366)


@dataclass(frozen=True, order=True)
class Slice:
    """One time slice of the history: rows with ``lo <= retire_at < hi`` (epoch seconds)."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if self.lo >= self.hi:
            raise ValueError(f"a slice ends after it starts: [{self.lo}, {self.hi})")

    @property
    def name(self) -> str:
        """The table name of a slice made here (existing slices are found by their bounds,
        whatever their names)."""
        return f"task_history_{self.lo}_{self.hi}"

    def bounds(self) -> tuple[datetime, datetime]:
        """The bounds as aware instants (UTC)."""
        return (datetime.fromtimestamp(self.lo, UTC), datetime.fromtimestamp(self.hi, UTC))


def check_history_settings(retention: timedelta | None, width: timedelta) -> None:
    """Refuse a slice width out of bounds, or one so narrow for the retention that the
    window would need more than ``MAX_SLICES`` slices."""
    if not MIN_WIDTH <= width <= MAX_WIDTH:
        raise ConfigError(
            f"history_slice must be between {MIN_WIDTH} and {MAX_WIDTH} (got {width})"
        )
    if width.total_seconds() != int(width.total_seconds()):
        raise ConfigError(f"history_slice must be whole seconds (got {width})")
    if retention is not None and slices_needed(retention, width) > MAX_SLICES:
        raise ConfigError(
            f"retention {retention} in slices of {width} would keep "
            f"{slices_needed(retention, width)} slices of task history, more than "
            f"{MAX_SLICES}: use a wider history_slice (at least {retention / (MAX_SLICES - 2)})"
        )


#: The slice width when none is set: a day, the unit retention is given in.
DEFAULT_WIDTH = timedelta(days=1)


def slice_width(retention: timedelta | None, chosen: timedelta | None) -> timedelta:
    """The slice width to use: ``chosen`` when set, else a day, or the hour-rounded width
    that keeps the retention window within ``MAX_SLICES`` slices."""
    if chosen is not None:
        return chosen
    if retention is None or slices_needed(retention, DEFAULT_WIDTH) <= MAX_SLICES:
        return DEFAULT_WIDTH
    hours = -(-int(retention.total_seconds()) // ((MAX_SLICES - 2) * 3600))
    return min(MAX_WIDTH, timedelta(hours=hours))


def slices_needed(retention: timedelta, width: timedelta) -> int:
    """How many aligned slices the window ``[now, now + retention]`` can touch."""
    w = int(width.total_seconds())
    return -(-int(retention.total_seconds()) // w) + 2


def aligned(at: int, width: int) -> Slice:
    """The slice of width ``width`` (seconds) aligned to the epoch that holds ``at``."""
    lo = at // width * width
    return Slice(lo, lo + width)


#: A bound of a range: epoch seconds here, instants read off a shard's catalog by a move.
B = TypeVar("B", int, datetime)


def merged(ranges: Iterable[tuple[B, B]]) -> list[tuple[B, B]]:
    """``ranges`` (half-open) sorted, with overlapping or touching ones joined; empty ones
    dropped."""
    out: list[tuple[B, B]] = []
    for lo, hi in sorted(r for r in ranges if r[0] < r[1]):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def uncovered(wanted: Iterable[tuple[B, B]], existing: Iterable[tuple[B, B]]) -> list[tuple[B, B]]:
    """The pieces of ``wanted`` that no range of ``existing`` covers, sorted and disjoint
    from each other and from ``existing``: the slices to create so that every wanted
    instant has one (a node's window ahead, or the rows a move copies to a shard whose
    slices have other bounds), since PostgreSQL refuses overlapping partitions."""
    have = merged(existing)
    out: list[tuple[B, B]] = []
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


def to_create(existing: Iterable[Slice], first: int, last: int, width: int) -> list[Slice]:
    """The slices to make so that every instant of ``[first, last]`` (epoch seconds) has
    one: the aligned slices of ``width`` over that span, each clipped to the gaps between the
    ``existing`` ones (made by a node of another width, or by hand). None overlaps an
    existing slice or another; at most ``MAX_SLICES`` aligned slices are considered (the
    span is the retention window, checked by ``check_history_settings``)."""
    if width <= 0:
        raise ValueError("a slice has a positive width")
    have = [(s.lo, s.hi) for s in existing]
    out: list[Slice] = []
    at = aligned(first, width).lo
    for _ in range(MAX_SLICES):
        if at > last:
            break
        out += [Slice(lo, hi) for lo, hi in uncovered([(at, at + width)], have)]
        at += width
    return out


def to_drop(existing: Iterable[Slice], now: int) -> list[Slice]:
    """The slices whose every row may go at ``now``: those whose upper bound has passed."""
    return sorted(s for s in existing if s.hi <= now)
