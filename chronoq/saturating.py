"""Saturating time arithmetic: stored durations and instants are clamped, never overflow.

The store keeps durations as bigint milliseconds. A row written by an older version, by a
bug or by hand can hold any of them (negative, zero, 2**63 - 1); turning one into a
``timedelta`` or adding it to ``now`` must not raise and stop a whole batch for every
tenant. These functions clamp first, then convert. Pure: no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

MS = timedelta(milliseconds=1)
END_OF_TIME = datetime.max.replace(tzinfo=UTC)  # the last instant Python can represent
START_OF_TIME = datetime.min.replace(tzinfo=UTC)
# The longest duration a stored value is read as: far beyond any limit a request may ask
# for, far below what ``timedelta`` can hold (999,999,999 days).
LONGEST = timedelta(days=100 * 366)


def clamp(value: timedelta, lowest: timedelta, highest: timedelta) -> timedelta:
    """``value`` within ``[lowest, highest]`` (``highest`` wins if the bounds cross)."""
    return min(max(value, lowest), highest)


def ms_to_delta(
    ms: int | None, lowest: timedelta = timedelta(0), highest: timedelta = LONGEST
) -> timedelta:
    """Integer milliseconds as stored, as a ``timedelta`` within ``[lowest, highest]``.

    The integer is clamped before the conversion, so no stored value can overflow it; a
    missing value (NULL) reads as ``lowest``.
    """
    if ms is None:
        return clamp(lowest, lowest, highest)
    low, high = ms_of(lowest), ms_of(highest)
    return clamp(min(max(int(ms), low), high) * MS, lowest, highest)


def ms_of(value: timedelta) -> int:
    """Whole milliseconds of ``value`` (floored), the unit the store keeps."""
    return value // MS


def shifted(at: datetime, delta: timedelta) -> datetime:
    """``at + delta``, saturated at the first and last instants Python represents."""
    try:
        return at + delta
    except OverflowError:
        return END_OF_TIME if delta > timedelta(0) else START_OF_TIME
