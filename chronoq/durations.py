"""Parsing of human durations ("250ms", "30s", "1h30m") and ISO 8601 instants.

Pure functions for the CLI and configuration. Errors are ``InvalidArgument`` naming the field
and saying what to write instead; nothing is guessed (a bare number has no unit, a time
without a zone has no meaning).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal

from chronoq.errors import InvalidArgument

_UNITS: dict[str, timedelta] = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_EXAMPLES = "e.g. 250ms, 30s, 5m, 1h, 2d or 1h30m"
_MAX = timedelta(days=100 * 365)
_MICROSECOND = timedelta(microseconds=1)


def parse_duration(text: str, *, field: str = "duration", allow_zero: bool = True) -> timedelta:
    """Parse ``<number><unit>`` parts (units ms, s, m, h, d), e.g. ``"1h30m"`` or ``"1.5s"``.

    Args:
        text: The duration as written by a person.
        field: The name used in error messages (a flag, a setting).
        allow_zero: Whether ``"0s"`` is acceptable.

    Raises:
        InvalidArgument: The text is empty, negative, has no unit or an unknown one.
    """
    raw = text.strip().lower().replace(" ", "")
    if not raw:
        raise InvalidArgument(field, f"is empty; write a duration, {_EXAMPLES}")
    if raw.startswith("-"):
        raise InvalidArgument(field, f"{text!r} is negative; durations must be >= 0")
    if _is_number(raw):
        raise InvalidArgument(field, f"{text!r} has no unit; write e.g. {raw}s or {raw}ms")
    total = timedelta(0)
    position = 0
    for match in _PART.finditer(raw):
        if match.start() != position:
            break
        total += _part(match.group(1), match.group(2), text, field)
        position = match.end()
    if position != len(raw):
        raise InvalidArgument(field, f"{text!r} is not a duration; write {_EXAMPLES}")
    if total == timedelta(0) and not allow_zero:
        raise InvalidArgument(field, f"{text!r} is zero; it must be longer than that")
    return total


def _part(number: str, unit: str, text: str, field: str) -> timedelta:
    micros = int(Decimal(number) * (_UNITS[unit] // _MICROSECOND))
    if micros > _MAX // _MICROSECOND:
        raise InvalidArgument(field, f"{text!r} is too long (over 100 years)")
    return timedelta(microseconds=micros)


def _is_number(text: str) -> bool:
    return _NUMBER.fullmatch(text) is not None


def format_duration(d: timedelta) -> str:
    """``d`` to the millisecond, spelt so ``parse_duration`` reads it back (90 s → ``"1m30s"``)."""
    if d < timedelta(0):
        return "-" + format_duration(-d)
    ms = d // timedelta(milliseconds=1)
    parts: list[str] = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def parse_instant(text: str, *, field: str = "time") -> datetime:
    """Parse an ISO 8601 date-time with a zone, e.g. ``2030-01-01T12:00:00Z`` or ``…+02:00``.

    Raises:
        InvalidArgument: The text is not ISO 8601, or carries no time zone.
    """
    raw = text.strip()
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidArgument(
            field, f"{text!r} is not an ISO 8601 time; write e.g. 2030-01-01T12:00:00Z"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        if len(raw) <= 10:  # a date alone: a zone needs a time to attach to
            raise InvalidArgument(
                field, f"{text!r} has no time of day and no zone; write e.g. {raw}T00:00:00Z"
            )
        raise InvalidArgument(
            field,
            f"{text!r} has no time zone; add one (e.g. {raw}+02:00) or Z for UTC ({raw}Z)",
        )
    return when
