"""A queue's settings: paused, and its limits per concurrency key. Pure.

One row per (namespace, queue) that sets anything (``queue_settings``, migration 0016); a
queue without one runs unpaused and without per-key limits. A queue is *gated* when its
settings pause it or limit it per key: such a queue's tasks reach workers only through
claims, whose statement enforces the gate, never through a hand-off (the dispatch gate,
``chronoq.node.dispatch.gate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class QueueSettings:
    """The settings of one queue (defaults: not paused, no per-key limit; 0 means none)."""

    namespace: str
    queue: str
    paused: bool = False
    paused_at: datetime | None = None  # when the current pause began
    max_running_per_key: int = 0  # RUNNING tasks per concurrency key at once
    max_starts_per_key: float = 0.0  # claims per concurrency key and second
    updated_at: datetime | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.queue

    @property
    def keyed(self) -> bool:
        """Whether it limits its tasks per concurrency key."""
        return self.max_running_per_key > 0 or self.max_starts_per_key > 0

    @property
    def gated(self) -> bool:
        """Whether its tasks go through claims only (paused, or limited per key)."""
        return self.paused or self.keyed

    @property
    def default(self) -> bool:
        """Whether it sets nothing (its row is removed: a queue without one is the same)."""
        return not self.gated


@dataclass(frozen=True)
class Resumed:
    """What a resume did: the settings now, the READY tasks its misfire pass skipped (their
    policy is SKIP and they waited past their grace while the queue was paused) and the READY
    tasks left to wake claims for (counted up to a bound)."""

    settings: QueueSettings
    skipped: int
    ready: int


@dataclass(frozen=True)
class QueueResumed:
    """A resume as its caller sees it: the settings now and the READY tasks it skipped."""

    settings: QueueSettings
    skipped: int
