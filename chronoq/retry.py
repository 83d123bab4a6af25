"""Retry backoff and the decision after a failed attempt. Pure; randomness is injected."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from chronoq.models import TaskState
from chronoq.saturating import clamp, ms_to_delta, shifted


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


def stored_backoff(
    attempts_used: int,
    initial_ms: int,
    max_ms: int,
    *,
    horizon: timedelta,
    rng: random.Random | None = None,
) -> timedelta:
    """``backoff`` for the values of a stored row, whatever they hold.

    The millisecond numbers are saturated into ``[0, horizon]`` before they become
    durations and an attempt count below 1 reads as 1, so a row written out of range (by an
    older version or by hand) still gets a retry time instead of raising.
    """
    return backoff(
        max(1, attempts_used),
        initial=ms_to_delta(initial_ms, highest=horizon),
        maximum=ms_to_delta(max_ms, highest=horizon),
        rng=rng,
    )


def retry_time(now: datetime, delay: timedelta, *, horizon: timedelta) -> datetime:
    """When a retry after ``delay`` runs: the delay saturated into ``[0, horizon]``."""
    return shifted(now, clamp(delay, timedelta(0), horizon))


def after_failure(
    *,
    attempt: int,
    max_attempts: int,
    retry_base: int,
    backoff_initial_ms: int,
    backoff_max_ms: int,
    now: datetime,
    horizon: timedelta,
    fatal: bool = False,
    retry_after: timedelta | None = None,
    rng: random.Random | None = None,
) -> tuple[TaskState, datetime]:
    """Where a failed attempt goes: DEAD (now), or back to waiting until a backoff time.

    The values are a stored task's, whatever they hold: the delay saturates at ``horizon``
    (a backoff of 2**63 ms from an older version retries a horizon from now instead of
    raising OverflowError). ``retry_after``, when given, replaces the backoff.
    """
    if fatal or not attempts_left(attempt, max_attempts, retry_base):
        return TaskState.DEAD, now
    delay = (
        retry_after
        if retry_after is not None
        else stored_backoff(
            attempt - retry_base, backoff_initial_ms, backoff_max_ms, horizon=horizon, rng=rng
        )
    )
    run_at = retry_time(now, delay, horizon=horizon)
    return (TaskState.READY if run_at <= now else TaskState.SCHEDULED), run_at
