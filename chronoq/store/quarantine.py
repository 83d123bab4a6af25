"""Poison isolation: a row that a background statement cannot process is set aside.

The owner's statements work in batches (fire, reap, materialise). One row that makes a
batch fail (a duration out of range, a state no version knows, a bad cron text), from an
older version, a bug or a hand edit, must not stop every other row of its partitions, pass
after pass. ``isolate`` retries a failed batch in halves down to the rows that fail alone;
those are quarantined by the caller (tasks DEAD, schedules paused, with the reason) and the
rest goes on in the same pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg

from chronoq.errors import InvalidArgument

# What one row's data can raise: PostgreSQL's data and constraint errors (SQLSTATE classes 22
# and 23, e.g. "interval out of range"), and Python's errors mapping or computing a value
# (OverflowError, an enum value no version knows, a cron with no next date). Never the
# driver's connection errors: those are an outage, not a poisoned row.
POISON: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError,
    asyncpg.exceptions.IntegrityConstraintViolationError,
    ArithmeticError,
    ValueError,
    TypeError,
    LookupError,
    InvalidArgument,
)
QUARANTINED = "quarantined: "  # how a quarantined row's recorded reason starts
MAX_REASON = 500

T = TypeVar("T")


def reason(exc: BaseException | str) -> str:
    """The reason recorded on a quarantined row, bounded and storable (no NUL)."""
    text = exc if isinstance(exc, str) else f"{exc} ({type(exc).__name__})"
    return (QUARANTINED + text.replace("\x00", "\\0"))[:MAX_REASON]


async def isolate(
    items: Sequence[T],
    attempt: Callable[[Sequence[T]], Awaitable[None]],
    poisoned: Callable[[T, BaseException], Awaitable[None]],
) -> None:
    """Run ``attempt`` over ``items``; on a data error, try each half, down to single items.

    A single item that still fails goes to ``poisoned`` with its error; every other item is
    processed. ``attempt`` must be atomic (one statement, or one savepoint) so that a failed
    try leaves nothing behind. One bad item among n costs about 2 log2(n) extra tries.
    """
    if not items:
        return
    try:
        await attempt(items)
    except POISON as exc:
        if len(items) == 1:
            await poisoned(items[0], exc)
            return
        mid = len(items) // 2
        await isolate(items[:mid], attempt, poisoned)
        await isolate(items[mid:], attempt, poisoned)
