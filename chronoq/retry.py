"""Retry backoff: exponential with jitter, capped. Pure; the random source is injected."""

from __future__ import annotations

import random
from datetime import timedelta


def backoff(
    attempt: int,
    *,
    initial: timedelta,
    maximum: timedelta,
    rng: random.Random | None = None,
    jitter: float = 0.5,
) -> timedelta:
    """Delay before the retry that follows failed attempt number ``attempt`` (1-based).

    ``initial * 2**(attempt-1)``, capped at ``maximum``, then scaled by a uniform factor in
    ``[1 - jitter, 1]`` so that tasks that failed together do not retry in lockstep
    ("equal jitter": the delay never drops below half of the exponential value).
    """
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError("jitter must be within [0, 1]")
    if initial < timedelta(0) or maximum < timedelta(0):
        raise ValueError("backoff durations must be >= 0")
    # Float seconds: initial * 2**n overflows timedelta long before the cap applies.
    exp_seconds = initial.total_seconds() * 2.0 ** min(attempt - 1, 1000)
    base = min(exp_seconds, maximum.total_seconds())
    factor = 1.0 - jitter * (rng or random).random()
    return timedelta(seconds=base * factor)


def attempts_left(attempt: int, max_attempts: int, retry_base: int = 0) -> bool:
    """Whether a task that just finished attempt ``attempt`` may run again.

    ``retry_base`` is the attempt count when the task was last requeued from the dead-letter
    state or released: attempts before it do not count against ``max_attempts``.
    """
    return attempt - retry_base < max_attempts
