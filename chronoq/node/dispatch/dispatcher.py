"""The one place a node acts on what its store writes did (``chronoq.effects``).

Every write that makes tasks READY or SCHEDULED hands its ``Effects`` here once it committed:
READY tasks wake as many waiting claims, long polls and streams of their queues (and the
other nodes, for what no local waiter took: ``ReadyNotifier.notify``); SCHEDULED tasks go to
the owner engine, whose wheel takes those due within its horizon when this node owns their
partition, and whose near-future notices (``SoonBroadcast``) tell their owners of the others.
The tick fires whatever the wheel misses, so a lost offer costs a tick at most, never a task.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from chronoq.clock import Clock
from chronoq.effects import Effects, Scheduled
from chronoq.node.dispatch.readiness import ReadyNotifier


class Offers(Protocol):
    """Where SCHEDULED tasks go: the node's owner engine (``chronoq.node.owner.engine.Owner``),
    whose wheel takes those of its partitions and whose notices tell the other owners."""

    def offer(self, scheduled: Sequence[Scheduled], now: datetime) -> None: ...


class Dispatch:
    """Applies effects: wake-ups first, then the owner's offers (in the order callers used
    to send them). Without an owner (a servicer or claims made alone, in tests) SCHEDULED
    tasks wait for the tick."""

    def __init__(self, notifier: ReadyNotifier, clock: Clock, owner: Offers | None = None) -> None:
        self.notifier = notifier
        self._clock = clock
        self._owner = owner

    def apply(self, effects: Effects, now: datetime | None = None) -> None:
        """Act on one committed write's effects; ``now``: the instant the write used (the
        wheel's horizon counts from it; default: the clock's)."""
        if effects.ready:
            self.notifier.notify(effects.ready)
        if effects.scheduled and self._owner is not None:
            self._owner.offer(effects.scheduled, now if now is not None else self._clock.now())
