"""The one place a node acts on what its store writes did (``chronoq.effects``).

Every write that makes tasks READY or SCHEDULED hands its ``Effects`` here once it committed:
READY tasks wake as many waiting claims, long polls and streams of their queues (and the
other nodes, for what no local waiter took: ``ReadyNotifier.notify``); SCHEDULED tasks due
within the timing wheel's horizon enter it when this node owns their partition, else reach
their owner through a near-future notice (``SoonBroadcast``). The tick fires whatever the
wheel misses, so a lost offer costs a tick at most, never a task.
"""

from __future__ import annotations

from datetime import datetime

from chronoq.clock import Clock
from chronoq.effects import Effects
from chronoq.node.precise import PreciseFirer
from chronoq.node.readiness import ReadyNotifier
from chronoq.node.soon import SoonBroadcast


class Dispatch:
    """Applies effects: wake-ups first, then the wheel's offers (in the order callers used to
    send them). The wheel and its notices are attached once they exist (a node without a
    wheel has neither: its SCHEDULED tasks wait for the tick)."""

    def __init__(self, notifier: ReadyNotifier, clock: Clock) -> None:
        self.notifier = notifier
        self._clock = clock
        self._wheel: PreciseFirer | None = None
        self._soon: SoonBroadcast | None = None

    def attach(self, wheel: PreciseFirer | None, soon: SoonBroadcast | None) -> None:
        """The node's timing wheel and near-future notices (None: it has none)."""
        self._wheel = wheel
        self._soon = soon

    def apply(self, effects: Effects, now: datetime | None = None) -> None:
        """Act on one committed write's effects; ``now``: the instant the write used (the
        wheel's horizon counts from it; default: the clock's)."""
        if effects.ready:
            self.notifier.notify(effects.ready)
        if effects.scheduled and self._wheel is not None:
            others = self._wheel.offer(
                effects.scheduled, now if now is not None else self._clock.now()
            )
            if others and self._soon is not None:
                self._soon.publish(others)
