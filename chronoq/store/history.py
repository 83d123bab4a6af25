"""The history of finished tasks: the sweep into ``task_history`` and its time slices.

Finished tasks (SUCCEEDED, CANCELLED, SKIPPED) leave ``tasks`` some time after they finish
(``retire_finished``: one statement moves a batch), into ``task_history``, ranged by
``retire_at`` (migration 0022). Retention then drops whole time slices whose upper bound has
passed (``keep_history``) instead of deleting rows one by one, so the history leaves no dead
tuples and its size follows the retention window; ``tasks`` keeps what is live, the DEAD
letters and the rows holding a unique window. Which slices to make and drop is decided by
``chronoq.history_slices`` (pure); the DDL runs here, one node at a time per database (a
transaction-level advisory lock, tried, never waited for) and never queued for long behind
a reader (``lock_timeout``): a pass that cannot take either is skipped and comes again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from chronoq.history_slices import Slice, to_create, to_drop
from chronoq.store.connection import Connected
from chronoq.store.sql import q

#: The advisory lock (class "chth", one object) that the slice upkeep of a database takes.
SLICE_LOCK = (0x63687468, 0)
#: How long a slice's DDL waits for the table's lock before it gives up for this pass: its
#: exclusive lock would hold up every reader of the history that queues behind it.
DDL_LOCK_TIMEOUT_MS = 500


@dataclass(frozen=True)
class Retired:
    """What one batch of the sweep did: rows that left ``tasks``, and of those, rows
    written to ``task_history`` (the rest were past their retention already)."""

    gone: int = 0
    kept: int = 0

    def __add__(self, other: Retired) -> Retired:
        return Retired(self.gone + other.gone, self.kept + other.kept)


@dataclass(frozen=True)
class SliceUpkeep:
    """What one upkeep pass of the slices did (``busy``: another node held the lock, or a
    reader held the table past the lock timeout; nothing was done)."""

    created: int = 0
    dropped: int = 0
    busy: bool = False

    def __add__(self, other: SliceUpkeep) -> SliceUpkeep:
        return SliceUpkeep(
            self.created + other.created, self.dropped + other.dropped, self.busy or other.busy
        )


def _seconds(at: datetime) -> int:
    return int(at.timestamp())


def _literal(at: datetime) -> str:
    """A timestamptz literal for DDL (which takes no parameters), from an aware instant."""
    return "'" + at.isoformat() + "'"


class HistoryStatements(Connected):
    """The sweep into the history, its slices, and how they are read."""

    async def retire_finished(
        self,
        partitions: Sequence[int],
        before: datetime,
        now: datetime,
        *,
        retention: timedelta | None,
        width: timedelta,
        batch: int,
    ) -> Retired:
        """Move up to ``batch`` tasks of ``partitions`` finished before ``before`` into the
        history (those already past ``retention`` at ``now`` deleted only). A row whose
        slice is missing (another node's upkeep has not run yet) makes the slices of the
        window, then the batch once more: until then its rows stay in tasks (one
        transaction)."""
        if not partitions:
            return Retired()
        for attempt in range(2):
            async with self.connection() as conn:
                try:
                    row = await conn.fetchrow(
                        self._q("retire_finished"), list(partitions), before, retention, batch, now
                    )
                except asyncpg.CheckViolationError:  # no slice for a row's retire_at
                    if attempt:
                        raise
                else:
                    return Retired(int(row["gone"]), int(row["kept"]))
            await self.keep_history(now, retention=retention, width=width)
        raise AssertionError("unreachable")

    async def keep_history(
        self, now: datetime, *, retention: timedelta | None, width: timedelta
    ) -> SliceUpkeep:
        """Drop the slices whose upper bound is past ``now``, and make those that rows
        retired from now on need (``[now, now + retention]``; none when kept forever), in one
        transaction under this database's slice lock."""
        w = int(width.total_seconds())
        try:
            async with self.connection() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {DDL_LOCK_TIMEOUT_MS}")
                if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1, $2)", *SLICE_LOCK):
                    return SliceUpkeep(busy=True)
                rows = await conn.fetch(q("history_slices"))
                have = {Slice(r["lo"], r["hi"]): r["name"] for r in rows if r["lo"] < r["hi"]}
                gone = to_drop(have, _seconds(now))
                left = [s for s in have if s not in set(gone)]
                made: list[Slice] = []
                if retention is not None:
                    made = to_create(left, _seconds(now), _seconds(now + retention), w)
                for s in gone:
                    await conn.execute(f"DROP TABLE IF EXISTS {_ident(have[s])}")
                for s in made:
                    lo, hi = s.bounds()
                    await conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {_ident(s.name)} PARTITION OF task_history "
                        f"FOR VALUES FROM ({_literal(lo)}) TO ({_literal(hi)})"
                    )
        except asyncpg.LockNotAvailableError:
            # A long reader holds the history: the pass was rolled back whole, and the next
            # one tries again (the sweep makes a missing slice itself meanwhile).
            return SliceUpkeep(busy=True)
        return SliceUpkeep(created=len(made), dropped=len(gone))


async def history_slices(store: Connected) -> list[tuple[str, Slice]]:
    """The time slices (name, bounds) of one database's history, by lower bound; not the
    forever one (for scripts and tests: the node needs none of it)."""
    async with store.connection() as conn:
        rows = await conn.fetch(q("history_slices"))
    return [(r["name"], Slice(r["lo"], r["hi"])) for r in rows if r["lo"] < r["hi"]]


def _ident(name: str) -> str:
    """A table name quoted for DDL (names come from the catalog or from ``Slice.name``)."""
    return '"' + name.replace('"', '""') + '"'
