"""When to restart a crashed child process: exponential backoff that forgets after a calm spell.

Pure: the caller passes monotonic instants in, so the policy is tested without waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from chronoq.retry import backoff

#: First restart delay after a crash, in seconds.
RESTART_INITIAL_S = 0.5
#: Longest delay between restarts of a child that keeps crashing.
RESTART_MAX_S = 10.0
#: A child that ran this long since its last start is stable: the next crash starts over.
RESTART_STABLE_S = 60.0


@dataclass
class RestartBackoff:
    """Delays between restarts of one child: 0.5 s doubling to 10 s, reset after a calm minute.

    ``started(now)`` when the child (re)starts, ``delay(now)`` when it is found dead: the
    seconds to wait before starting it again.
    """

    initial: float = RESTART_INITIAL_S
    maximum: float = RESTART_MAX_S
    stable: float = RESTART_STABLE_S
    failures: int = 0
    last_start: float | None = None

    def started(self, now: float) -> None:
        """The child was started at ``now``."""
        self.last_start = now

    def delay(self, now: float) -> float:
        """Seconds to wait before the next start, for a child found dead at ``now``."""
        if self.last_start is not None and now - self.last_start >= self.stable:
            self.failures = 0
        self.failures += 1
        return backoff(
            self.failures,
            initial=timedelta(seconds=self.initial),
            maximum=timedelta(seconds=self.maximum),
            jitter=0.0,
        ).total_seconds()
