"""The history slices a move needs on its target: the source's live slices, and the pieces of
them the target lacks, created there (``chronoq.history_slices.uncovered`` decides which).

A move copies a partition's ``task_history`` rows (migration 0022) with their ``retire_at``;
the target routes each row to the slice that holds its ``retire_at`` and refuses one that no
slice holds. So before rows go, the target is given what covers the source's slices that
are not expired yet (their upper bound after the source's ``now()``). Expired rows are not
copied: their slice is dropped on the source, and on the target they would only wait for
their own drop. The slices are read and made as the retention's upkeep does
(``chronoq.store.history``: the same query, advisory lock, lock timeout and names), so the
two never make overlapping slices on one shard.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from chronoq.errors import MoveRefused, StoreUnavailable
from chronoq.history_slices import MAX_SLICES, Slice, uncovered
from chronoq.store.history import DDL_LOCK_TIMEOUT_MS, SLICE_LOCK
from chronoq.store.sql import q

#: A slice's bounds as the catalog gives them: ``[lo, hi)``.
Range = tuple[datetime, datetime]

#: The history rows a move copies: those whose slice is not dropped yet.
LIVE_HISTORY = "retire_at > now()"
#: Tries to cover the target while the retention's upkeep holds the slice lock, or a reader
#: holds the history past the DDL's lock timeout.
COVER_TRIES = 10
#: The most slices a move makes on its target at once: the retention's own window needs at
#: most ``MAX_SLICES`` on each shard, and the gaps between another width's slices at most as
#: many again. More is a source whose history was sliced by hand; every slice costs each read
#: of the history a lock and an index probe, so the move is refused instead.
MAX_COVER = 2 * MAX_SLICES + 2


async def slices(conn: Any, *, live_only: bool = False) -> list[Range]:
    """The time slices of ``conn``'s history (inside a transaction: as of its snapshot);
    ``live_only``: those whose upper bound is after the server's ``now()`` (in a
    transaction: its start, the ``now()`` of ``LIVE_HISTORY`` in the same transaction)."""
    rows = await conn.fetch(q("history_slices"))
    now = await conn.fetchval("SELECT now()") if live_only else None
    out = []
    for r in rows:
        lo, hi = _instant(r["lo"]), _instant(r["hi"])
        if lo < hi and (now is None or hi > now):
            out.append((lo, hi))
    return out


async def cover(conn: Any, wanted: Sequence[Range]) -> int:
    """Create on ``conn`` (not in a transaction) the slices that cover ``wanted`` where its
    history has none; returns how many were made. Under the slice lock of the retention's
    upkeep (tried; while another holds it, tried again a moment later)."""
    if not wanted:
        return 0
    for attempt in range(COVER_TRIES):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {DDL_LOCK_TIMEOUT_MS}")
                if await conn.fetchval("SELECT pg_try_advisory_xact_lock($1, $2)", *SLICE_LOCK):
                    missing = uncovered(wanted, await slices(conn))
                    if len(missing) > MAX_COVER:
                        raise MoveRefused(
                            f"the moved history needs {len(missing)} new slices on the target"
                            f" (at most {MAX_COVER}): the source's task_history has more time"
                            " slices than a retention window makes; drop or merge them first"
                        )
                    for lo, hi in missing:
                        piece = Slice(_seconds(lo), _seconds(hi))
                        await conn.execute(
                            f'CREATE TABLE IF NOT EXISTS "{piece.name}" PARTITION OF task_history'
                            f" FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')"
                        )
                    return len(missing)
        except asyncpg.exceptions.LockNotAvailableError:
            pass
        await asyncio.sleep(0.05 * (attempt + 1))
    raise StoreUnavailable(
        f"could not make the history slices a move needs on the target in {COVER_TRIES}"
        " tries (the slice lock or the history's lock stayed taken); the phase can be run again"
    )


def _instant(epoch_seconds: int) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC)


def _seconds(at: datetime) -> int:
    return int(at.timestamp())
