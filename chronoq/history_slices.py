"""The time slices of the task history: which to create, which to drop (pure, no I/O).

``task_history`` is ranged by ``retire_at`` (migration 0022), so retention drops a whole slice
once its upper bound has passed instead of deleting rows one by one. A slice is a half-open
range ``[lo, hi)`` of epoch seconds; slices are aligned to multiples of their width since the
epoch, so every node that uses one width computes the same bounds. Two nodes configured with
different widths must still never make overlapping slices (PostgreSQL refuses them): a new
slice is clipped to the gaps that the existing ones leave.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from chronoq.errors import ConfigError

#: The most time slices a retention window may need (retention / width, plus the two ends).
#: Every read of the history (a task by id, a keyed submit's check) locks each slice and its
#: four indexes: 64 slices keep that near 320 locks a statement, well inside PostgreSQL's
#: shared lock table (max_locks_per_transaction x connections).
MAX_SLICES = 64
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


def _gaps(want: Slice, existing: Sequence[Slice]) -> list[Slice]:
    """The parts of ``want`` that no slice of ``existing`` (sorted) covers."""
    out: list[Slice] = []
    start = want.lo
    for s in existing:
        if s.hi <= start:
            continue
        if s.lo >= want.hi:
            break
        if s.lo > start:
            out.append(Slice(start, s.lo))
        start = max(start, s.hi)
        if start >= want.hi:
            return out
    if start < want.hi:
        out.append(Slice(start, want.hi))
    return out


def to_create(existing: Iterable[Slice], first: int, last: int, width: int) -> list[Slice]:
    """The slices to make so that every instant of ``[first, last]`` (epoch seconds) has
    one: the aligned slices of ``width`` over that span, each clipped to the gaps between the
    ``existing`` ones (made by a node of another width, or by hand). None overlaps an
    existing slice or another; at most ``MAX_SLICES`` aligned slices are considered (the
    span is the retention window, checked by ``check_history_settings``)."""
    if width <= 0:
        raise ValueError("a slice has a positive width")
    have = sorted(existing)
    out: list[Slice] = []
    at = aligned(first, width).lo
    for _ in range(MAX_SLICES):
        if at > last:
            break
        out += _gaps(Slice(at, at + width), have)
        at += width
    return out


def to_drop(existing: Iterable[Slice], now: int) -> list[Slice]:
    """The slices whose every row may go at ``now``: those whose upper bound has passed."""
    return sorted(s for s in existing if s.hi <= now)
