"""A catch-up round of a move: the source's (id, xmin) of the moving rows compared with what
the target recorded, on the target's server, and the difference applied in batches.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chronoq.errors import StoreUnavailable
from chronoq.store.move_history import cover, slices
from chronoq.store.move_layout import (
    _DROP_TEMP,
    _IDLE,
    _TEMP,
    _TRACKED,
    HISTORY,
    _count,
    _Layout,
    _list,
    _Tracked,
)
from chronoq.store.move_steps import MoveSteps


@dataclass(frozen=True)
class Round:
    """What one catch-up round did and read."""

    listed: int  # rows of the moving partitions on the source
    changed: int  # rows copied again, new or deleted on the target
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.listed / self.seconds if self.seconds > 0 else float("inf")


class MoveRounds(MoveSteps):
    """The rounds of a move (the catch-up, and the frozen last round of a cut-over)."""

    #: What the last round did (None before the first).
    last_round: Round | None = None

    async def _round(self) -> Round:
        """Compare the source's (id, xmin) of the moving rows with what the target recorded,
        on the target's server (temporary tables), and apply the difference in batches."""
        layout = await self._load_layout()
        started = time.monotonic()
        listed = changed = 0
        async with self.source.connection() as s, self.target.connection() as t:
            try:
                for tracked in _TRACKED:
                    seen, diff = await self._diff(s, t, tracked, layout.columns[tracked.table])
                    listed += seen
                    changed += diff
                async with s.transaction(isolation="repeatable_read", readonly=True):
                    await s.execute(_IDLE)
                    async with t.transaction():
                        await t.execute(_IDLE)
                        await self._fence_target(t)
                        await self._replace(s, t, layout)
            finally:
                with contextlib.suppress(Exception):
                    await t.execute(_DROP_TEMP, timeout=10)
        result = Round(listed, changed, time.monotonic() - started)
        self.last_round = result
        return result

    async def _diff(
        self, s: Any, t: Any, tracked: _Tracked, cols: Sequence[str]
    ) -> tuple[int, int]:
        kind = tracked.kind
        await t.execute(_TEMP.format(table=tracked.table), timeout=self.phase_timeout)
        listed = await self._stream(
            s,
            f"SELECT partition, id, xmin::text::bigint FROM {tracked.table}"
            f" WHERE {self._moving} AND {tracked.live}",
            (),
            t,
            "chronoq_move_seen",
            ("partition", "id", "source_xmin"),
        )
        parts = list(self.partitions)
        await t.execute("ANALYZE chronoq_move_seen", timeout=self.phase_timeout)
        gone = _count(
            await t.execute(
                "INSERT INTO chronoq_move_gone (n, partition, id) SELECT row_number() OVER (),"
                " r.partition, r.id FROM move_rows r WHERE r.partition = ANY($1::smallint[])"
                " AND r.kind = $2 AND NOT EXISTS (SELECT 1 FROM chronoq_move_seen s"
                " WHERE s.id = r.id)",
                parts,
                kind,
                timeout=self.phase_timeout,
            )
        )
        fresh = _count(
            await t.execute(
                "INSERT INTO chronoq_move_changed (n, id) SELECT row_number() OVER (), s.id"
                " FROM chronoq_move_seen s LEFT JOIN move_rows r ON r.partition = s.partition"
                " AND r.kind = $1 AND r.id = s.id"
                " WHERE r.id IS NULL OR r.source_xmin <> s.source_xmin",
                kind,
                timeout=self.phase_timeout,
            )
        )
        for lo in range(0, gone, self.batch_rows):
            hi = lo + self.batch_rows
            async with t.transaction():
                await self._fence_target(t)
                await t.execute(
                    "DELETE FROM move_rows r USING chronoq_move_gone g WHERE g.n > $1 AND"
                    " g.n <= $2 AND r.partition = g.partition AND r.kind = $3 AND r.id = g.id",
                    lo,
                    hi,
                    kind,
                    timeout=self.phase_timeout,
                )
                await t.execute(
                    f"DELETE FROM {tracked.table} x USING chronoq_move_gone g WHERE g.n > $1"
                    " AND g.n <= $2 AND x.id = g.id",
                    lo,
                    hi,
                    timeout=self.phase_timeout,
                )
        stage = f"chronoq_move_stage_{tracked.table}"
        # Every changed row's old copy goes before any new version comes: a key of a unique
        # index (a unique or debounce key's pending task, migration 0019) passes from one row
        # to another between rounds, and the new holder's batch may come before the batch of
        # the old holder's new version. A copy taken out and not yet put back has no move_rows
        # entry, so a crash in between leaves it changed for the next round.
        for lo in range(0, fresh, self.batch_rows):
            async with t.transaction():
                await self._fence_target(t)
                ids = await self._changed(t, lo)
                await t.execute(
                    "DELETE FROM move_rows WHERE partition = ANY($1::smallint[]) AND kind = $2"
                    " AND id = ANY($3::uuid[])",
                    parts,
                    kind,
                    ids,
                    timeout=self.phase_timeout,
                )
                await t.execute(
                    f"DELETE FROM {tracked.table} WHERE id = ANY($1::uuid[])",
                    ids,
                    timeout=self.phase_timeout,
                )
        if fresh and tracked.table == HISTORY:
            await cover(t, await slices(s, live_only=True))
        for lo in range(0, fresh, self.batch_rows):
            ids = await self._changed(t, lo)
            await t.execute(f"TRUNCATE {stage}", timeout=self.phase_timeout)
            await self._stream(
                s,
                f"SELECT {_list(cols)}, xmin::text::bigint FROM {tracked.table}"
                f" WHERE id = ANY($1::uuid[]) AND {self._moving} AND {tracked.live}",
                (ids,),
                t,
                stage,
                (*cols, "chronoq_source_xmin"),
            )
            await self._insert_staged(s, t, tracked, cols)
        return listed, gone + fresh

    async def _insert_staged(self, s: Any, t: Any, tracked: _Tracked, cols: Sequence[str]) -> None:
        """The staged rows into their table and move_rows, in one transaction. A history row
        whose slice the source made after this round covered the target (a new day's) is
        refused there: the target is covered again and the batch tried once more."""
        stage = f"chronoq_move_stage_{tracked.table}"
        for attempt in range(2):
            try:
                async with t.transaction():
                    await self._fence_target(t)
                    await self._translate_unique(
                        t.execute(
                            f"INSERT INTO {tracked.table} ({_list(cols)}) SELECT {_list(cols)}"
                            f" FROM {stage}",
                            timeout=self.phase_timeout,
                        )
                    )
                    await t.execute(
                        "INSERT INTO move_rows (partition, kind, id, source_xmin) SELECT"
                        f" partition, {tracked.kind}::smallint, id, chronoq_source_xmin"
                        f" FROM {stage}",
                        timeout=self.phase_timeout,
                    )
                return
            except StoreUnavailable:
                if tracked.table != HISTORY or attempt:
                    raise
                await cover(t, await slices(s, live_only=True))

    async def _changed(self, t: Any, lo: int) -> list[Any]:
        """The ids of the changed rows ``lo + 1 .. lo + batch_rows`` (of ``_diff``)."""
        return [
            r["id"]
            for r in await t.fetch(
                "SELECT id FROM chronoq_move_changed WHERE n > $1 AND n <= $2",
                lo,
                lo + self.batch_rows,
                timeout=self.phase_timeout,
            )
        ]

    async def _replace(self, s: Any, t: Any, layout: _Layout) -> None:
        """The small tables keyed by partition, copied whole (inside the callers'
        transactions)."""
        for table in layout.replaced:
            cols = layout.columns[table]
            await t.execute(f"DELETE FROM {table} WHERE {self._moving}", timeout=self.phase_timeout)
            await self._stream(
                s, f"SELECT {_list(cols)} FROM {table} WHERE {self._moving}", (), t, table, cols
            )
