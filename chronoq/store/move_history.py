"""The history slices a move needs on its target: the source's live slices, and the pieces of
them the target lacks, created there (``chronoq.slice_cover`` decides which).

A move copies a partition's ``task_history`` rows (migration 0022) with their ``retire_at``;
the target routes each row to the slice that holds its ``retire_at`` and refuses one that no
slice holds. So before rows go, the target is given what covers the source's slices that
are not expired yet (their upper bound after the source's ``now()``). Expired rows are not
copied: their slice is dropped on the source, and on the target they would only wait for
their own drop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from chronoq.errors import StoreUnavailable
from chronoq.slice_cover import Range, uncovered

#: The history rows a move copies: those whose slice is not dropped yet.
LIVE_HISTORY = "retire_at > now()"
#: A slice's DDL waits at most this long for its lock (a long query on the history must not
#: make the move, or the statements queued behind the DDL, wait with it).
DDL_LOCK_TIMEOUT = "1s"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Tries to cover the target when another node makes slices at the same moment.
COVER_TRIES = 5

# The time slices' bounds, read back from their partition bounds (the forever slice, FROM
# ('infinity') TO (MAXVALUE), has no quoted upper bound and is left out: every shard has it).
_SLICES = (
    "SELECT b[1]::timestamptz AS lo, b[2]::timestamptz AS hi FROM ("
    " SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid),"
    " 'FROM \\(''([^'']*)''\\) TO \\(''([^'']*)''\\)') AS b"
    " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = to_regclass('task_history')) x"
    " WHERE b IS NOT NULL"
)


async def slices(conn: Any, *, live_only: bool = False) -> list[Range]:
    """The time slices of ``conn``'s history (inside a transaction: as of its snapshot);
    ``live_only``: those whose upper bound is after the server's ``now()``."""
    sql = f"SELECT lo, hi FROM ({_SLICES}) s" + (" WHERE hi > now()" if live_only else "")
    return [(r["lo"], r["hi"]) for r in await conn.fetch(sql)]


def slice_name(lo: datetime, hi: datetime) -> str:
    """A slice made for a move is named by both its bounds in microseconds since the epoch
    (no other slice has them), quoted."""
    return f'"task_history_{_epoch(lo)}_{_epoch(hi)}"'


async def cover(conn: Any, wanted: Sequence[Range]) -> int:
    """Create on ``conn`` (not in a transaction) the slices that cover ``wanted`` where its
    history has none; returns how many were made. Another node may make slices at the same
    moment (an overlap is refused): the target's slices are read again and the rest made."""
    if not wanted:
        return 0
    made = 0
    for attempt in range(COVER_TRIES):
        missing = uncovered(wanted, await slices(conn))
        if not missing:
            return made
        try:
            for lo, hi in missing:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
                    await conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {slice_name(lo, hi)} PARTITION OF"
                        f" task_history FOR VALUES FROM ('{_literal(lo)}') TO ('{_literal(hi)}')"
                    )
                made += 1
        except (
            asyncpg.exceptions.LockNotAvailableError,
            asyncpg.exceptions.InvalidObjectDefinitionError,  # overlaps a slice made meanwhile
            asyncpg.exceptions.DuplicateTableError,
        ):
            await asyncio.sleep(0.05 * (attempt + 1))
    raise StoreUnavailable(
        f"could not make the history slices a move needs on the target after {COVER_TRIES}"
        " tries (their DDL kept waiting for locks); the phase can be run again"
    )


def _epoch(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1)


def _literal(t: datetime) -> str:
    """A bound as a timestamptz literal (read from the server: exact, in UTC)."""
    return t.astimezone(UTC).isoformat()
