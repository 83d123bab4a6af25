"""Clocks: every comparison with a task's ``run_at`` goes through one of these.

The node never calls ``datetime.now()`` or SQL ``now()`` itself; it asks its ``Clock`` and
passes the answer into SQL, so tests (and the cluster's virtual clock) can move time.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """A source of the current wall-clock time, timezone-aware, in UTC."""

    def now(self) -> datetime: ...


class SystemClock:
    """The machine's wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to (tests, the lab's virtual time)."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime.now(UTC)
        if start.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start time")
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError("ManualClock.set needs a timezone-aware time")
        with self._lock:
            self._now = when

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now


class OffsetClock:
    """The system clock shifted by a fixed offset (a node whose clock jumped)."""

    def __init__(self, offset: timedelta) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset
