"""Recurring schedules: cron expressions and fixed intervals in a time zone. Pure.

``next_fire(rule, after)`` is the first occurrence strictly after ``after``; ``due(...)``
decides, for an owner that materialises occurrences as tasks, which occurrences to create
now and where the schedule continues, under a catch-up policy after downtime:

- ``ALL``: every missed occurrence is created (bounded per call, the rest next call);
- ``LATEST``: only the most recent missed occurrence;
- ``NONE``: missed occurrences are dropped; only future ones are created.

Occurrences up to ``now + lookahead`` are created ahead of time, so each task waits in its
time bucket and fires on time like any other task.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from chronoq.errors import InvalidArgument, shown


class CatchUp(enum.IntEnum):
    ALL = 0
    LATEST = 1
    NONE = 2


@dataclass(frozen=True)
class Cron:
    """A five-field cron expression, evaluated in ``timezone`` (DST-aware)."""

    expression: str
    timezone: str = "UTC"


@dataclass(frozen=True)
class Every:
    """A fixed interval counted from ``anchor`` (time zones do not matter)."""

    interval: timedelta
    anchor: datetime


Rule = Cron | Every

MIN_INTERVAL = timedelta(seconds=1)


#: An IANA zone name: ``Region/City`` parts, nothing that reads as a path of its own.
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*")


def zone(name: str) -> ZoneInfo:
    """The zone named ``name``; ``InvalidArgument`` for anything else (a directory of the zone
    database such as ``America``, a relative path, a file that is not a zone)."""
    if _ZONE_NAME.fullmatch(name) is None:
        raise InvalidArgument("timezone", f"{shown(name)} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument("timezone", f"{shown(name)} is not an IANA time zone name") from None


def check(rule: Rule, now: datetime | None = None) -> Rule:
    """Return ``rule`` if valid, else raise ``InvalidArgument`` saying what to fix.

    With ``now``, a cron expression must also have an occurrence after it (``0 0 31 2 *``,
    February 31st, has none).
    """
    if isinstance(rule, Cron):
        zone(rule.timezone)
        fields = rule.expression.split()
        if len(fields) != 5 or not croniter.is_valid(rule.expression):
            raise InvalidArgument(
                "cron",
                f"{shown(rule.expression)} is not a 5-field cron expression (e.g. '*/5 * * * *')",
            )
        if now is not None:
            try:
                next_fire(rule, now)
            except (CroniterError, ValueError, OverflowError):
                raise InvalidArgument(
                    "cron", f"{shown(rule.expression)} has no next occurrence"
                ) from None
    else:
        if rule.interval < MIN_INTERVAL:
            raise InvalidArgument(
                "interval", f"must be at least {MIN_INTERVAL}, got {rule.interval}"
            )
        if rule.anchor.tzinfo is None:
            raise InvalidArgument("start_at", "must carry a time zone")
    return rule


def next_fire(rule: Rule, after: datetime) -> datetime:
    """The first occurrence strictly after ``after`` (aware, UTC)."""
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    if isinstance(rule, Every):
        if after < rule.anchor:
            return rule.anchor.astimezone(UTC)
        steps = math.floor((after - rule.anchor) / rule.interval) + 1
        return (rule.anchor + steps * rule.interval).astimezone(UTC)
    local = after.astimezone(zone(rule.timezone))
    it = croniter(rule.expression, local)
    nxt: datetime = it.get_next(datetime)
    return nxt.astimezone(UTC)


def occurrences(rule: Rule, after: datetime, before: datetime, limit: int) -> list[datetime]:
    """The occurrences strictly after ``after`` and before ``before``, the first ``limit``."""
    out: list[datetime] = []
    at = next_fire(rule, after)
    while at < before and len(out) < limit:
        out.append(at)
        at = next_fire(rule, at)
    return out


@dataclass(frozen=True)
class Plan:
    """What to create now, where the schedule continues, and how many were skipped."""

    create: list[datetime]
    next_fire_at: datetime
    skipped: int


def due(
    rule: Rule,
    next_fire_at: datetime,
    now: datetime,
    policy: CatchUp,
    *,
    lookahead: timedelta = timedelta(seconds=60),
    limit: int = 1000,
) -> Plan:
    """Occurrences from ``next_fire_at`` on that should exist as tasks by ``now``."""
    horizon = now + lookahead
    missed: list[datetime] = []
    ahead: list[datetime] = []
    at = next_fire_at
    skipped = 0
    while at <= horizon and len(missed) + len(ahead) < limit:
        (missed if at < now else ahead).append(at)
        at = next_fire(rule, at)
    if policy is CatchUp.LATEST and len(missed) > 1:
        skipped, missed = len(missed) - 1, missed[-1:]
    elif policy is CatchUp.NONE and missed:
        skipped, missed = len(missed), []
    if at <= horizon and policy is not CatchUp.ALL:
        # More missed occurrences than one pass looks at: jump past them in one go.
        while at < now:
            at = next_fire(rule, at)
            skipped += 1
    return Plan(missed + ahead, at, skipped)
