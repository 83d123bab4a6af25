"""The steps every phase of a move is made of: streams between the shards (through the
pipe), the fences on each shard's holdings, the target's and source's rows, the move
index and the tables' layout (``chronoq.store.mover``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

import asyncpg

from chronoq.errors import InvalidArgument, StoreUnavailable
from chronoq.store.connection import Connected
from chronoq.store.move_layout import _REPLACED, _TRACKED, _columns, _last, _Layout, index_name
from chronoq.store.move_pipe import _both, _copied, _Pipe
from chronoq.store.move_state import (
    _STATES,
    FROZEN,
    GONE,
    INCOMING,
    LIVE,
    Holdings,
    MoveRefused,
    StaleMoveToken,
    _shown,
    store_holdings,
)

#: Bytes a stream from the source to the target holds at most between the two servers.
BUFFER_BYTES = 8 << 20
#: Ids re-copied or deleted per statement (a catch-up batch, a clean-up batch).
BATCH_ROWS = 2_000
#: Rows of the source deleted per statement by the clean-up (short transactions, no bloat
#: spike: the owner's statements on other partitions do not wait behind it).
DELETE_ROWS = 5_000
#: Seconds a phase may take at most (copying a large partition takes minutes).
PHASE_TIMEOUT = 3_600.0
#: Seconds a stream between the shards may go without moving a byte: a server killed in the
#: middle of a COPY can leave the driver's side of it waiting for ever.
STALL_TIMEOUT = 30.0
#: A move id: it names the move's index and appears in shard_partitions.
_MOVE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


class MoveSteps:
    """One move's arguments, checked, and the steps its phases are made of."""

    def __init__(
        self,
        source: Connected,
        target: Connected,
        partitions: Sequence[int],
        move_id: str,
        token: int,
        *,
        freeze_budget: float = 1.0,
        buffer_bytes: int = BUFFER_BYTES,
        batch_rows: int = BATCH_ROWS,
        phase_timeout: float = PHASE_TIMEOUT,
        holdings: Holdings | None = None,
        index_partitions: Sequence[int] | None = None,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        if source is target:
            raise InvalidArgument("target", "a move needs two different shards")
        if source.partitions != target.partitions:
            raise InvalidArgument(
                "target",
                f"the shards count {source.partitions} and {target.partitions} partitions",
            )
        if not _MOVE_ID.fullmatch(move_id):
            raise InvalidArgument(
                "move_id", "1-64 letters, digits and . _ : - (starting with a letter or digit)"
            )
        moving = sorted(set(partitions))
        if not moving:
            raise InvalidArgument("partitions", "name at least one partition to move")
        if moving[0] < 0 or moving[-1] >= source.partitions:
            raise InvalidArgument(
                "partitions", f"partitions are 0..{source.partitions - 1}, got {moving[-1]}"
            )
        if token <= 0:
            raise InvalidArgument("token", f"a move token is positive, got {token}")
        if freeze_budget <= 0:
            raise InvalidArgument("freeze_budget", f"must be positive, got {freeze_budget}")
        self.source = source
        self.target = target
        self.partitions: tuple[int, ...] = tuple(moving)
        self.move_id = move_id
        self.token = token
        self.freeze_budget = freeze_budget
        self.buffer_bytes = max(64 * 1024, buffer_bytes)
        self.batch_rows = max(1, batch_rows)
        self.phase_timeout = phase_timeout
        self.stall_timeout = stall_timeout
        self.index = index_name(move_id)
        # The whole move's partitions, when this mover is one group of it (``group``): the
        # move index covers them all.
        whole = sorted(set(index_partitions)) if index_partitions is not None else moving
        if not set(moving) <= set(whole):
            raise InvalidArgument("partitions", "a group's partitions are some of its move's")
        self.index_partitions: tuple[int, ...] = tuple(whole)
        # One literal for the index's predicate and every query over the moving rows: the
        # planner proves a partial index usable by matching the expression (a group adds
        # its own partitions as a second condition, which keeps the match).
        self._index_predicate = f"partition = ANY('{{{','.join(map(str, whole))}}}'::smallint[])"
        self._moving = self._index_predicate
        if tuple(whole) != self.partitions:
            self._moving += f" AND partition = ANY('{{{','.join(map(str, moving))}}}'::smallint[])"
        self._given_holdings = holdings
        self._owns_index = False

        self._layout: _Layout | None = None

    @property
    def is_group(self) -> bool:
        """Whether this mover is a part of a larger move (it leaves the move index alone)."""
        return self.index_partitions != self.partitions

    @property
    def _holdings_ops(self) -> Holdings:
        if self._given_holdings is None:
            self._given_holdings = store_holdings()
        return self._given_holdings

    # -- streams ---------------------------------------------------------------------------

    async def _stream(
        self,
        s: Any,
        query: str,
        args: Sequence[Any],
        t: Any,
        table: str,
        columns: Sequence[str],
    ) -> int:
        """``COPY (query) TO STDOUT`` on the source into ``COPY table FROM STDIN`` on the
        target, binary, through a pipe of ``buffer_bytes``; returns the rows."""
        pipe = _Pipe(self.buffer_bytes)

        async def produce() -> None:
            try:
                await s.copy_from_query(
                    query, *args, output=pipe.put, format="binary", timeout=self.phase_timeout
                )
            except BaseException as exc:
                await pipe.close(exc)
                raise
            await pipe.close()

        async def consume() -> str:
            status: str = await t.copy_to_table(
                table,
                source=pipe,
                columns=list(columns),
                format="binary",
                timeout=self.phase_timeout,
            )
            return status

        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(loop.time() + self.stall_timeout) as stall:
                pipe.on_progress = lambda: stall.reschedule(loop.time() + self.stall_timeout)
                _, status = await _both(produce(), self._translate_unique(consume()))
        except TimeoutError:
            raise StoreUnavailable(
                f"move {self.move_id!r}: the stream into {table} moved nothing for "
                f"{self.stall_timeout:g} s (a shard stopped answering); the phase can be run "
                "again"
            ) from None
        return _copied(status)

    async def _translate_unique(self, statement: Awaitable[Any]) -> Any:
        try:
            return await statement
        except asyncpg.exceptions.CheckViolationError as exc:
            if "no partition of relation" not in str(exc):
                raise
            # A history row whose slice the target lacks (made on the source meanwhile, or
            # dropped on the target by a clock ahead of the source's): nothing was written.
            raise StoreUnavailable(
                f"move {self.move_id!r}: the target has no history slice for a copied row"
                f" ({exc}); the phase can be run again"
            ) from exc
        except asyncpg.exceptions.UniqueViolationError as exc:
            raise MoveRefused(
                f"move {self.move_id!r}: a copied row collides with a row the target already "
                f"has ({exc.detail or exc}): a key placed before routing was wired lives in "
                "another partition there (build the legacy routes first, docs/design/shards.md)"
            ) from exc

    # -- fences and holdings ---------------------------------------------------------------

    async def _holdings(self, store: Connected) -> list[Any]:
        held = await self._holdings_ops.held(store)
        return [held.get(p) for p in self.partitions]

    async def _fence_target(self, t: Any) -> None:
        await self._fence(t, self.target, (INCOMING,))

    async def _fence(self, conn: Any, store: Connected, states: Sequence[int]) -> None:
        """Inside a transaction: the partitions' holdings on this shard are this move's, in
        one of ``states``, and stay so until it commits (FOR SHARE: a newer mover's change of
        them waits for it, and then refuses this one)."""
        rows = await conn.fetch(
            "SELECT partition, state, move_id, move_token FROM shard_partitions"
            " WHERE partition = ANY($1::smallint[]) FOR SHARE",
            list(self.partitions),
            timeout=self.phase_timeout,
        )
        found = {r["partition"]: r for r in rows}
        side = "target" if store is self.target else "source"
        for p in self.partitions:
            row = found.get(p)
            if row is not None and row["move_token"] is not None and row["move_token"] > self.token:
                raise StaleMoveToken(self.move_id, self.token, row["move_token"])
            if (
                row is None
                or row["move_id"] != self.move_id
                or row["move_token"] != self.token
                or row["state"] not in states
            ):
                raise MoveRefused(
                    f"move {self.move_id!r}: partition {p} on the {side} shard is "
                    f"{_shown(row)}, not {'/'.join(_STATES[s] for s in states)} for this move"
                )

    async def _give_back(self) -> None:
        """Target incoming (if it was made live), then the source live (if it was frozen)."""
        target = await self._holdings(self.target)
        if any(h is not None and h.state == LIVE and h.move_id == self.move_id for h in target):
            await self._holdings_ops.mark_incoming(
                self.target, self.partitions, self.move_id, self.token
            )
        await self._unfreeze_source()

    async def _unfreeze_source(self) -> None:
        """The source's partitions live again, if this move froze them."""
        source = await self._holdings(self.source)
        if any(h is not None and h.state == FROZEN and h.move_id == self.move_id for h in source):
            await self._holdings_ops.unfreeze(
                self.source, self.partitions, self.move_id, self.token
            )

    # -- target and source rows ------------------------------------------------------------

    async def _empty_target(self) -> None:
        """Delete what earlier copies of this move left on the target, in batches (found by
        their move_rows entries: the target has no index of a partition's rows)."""
        parts = list(self.partitions)
        layout = await self._load_layout()
        for tracked in _TRACKED:
            while True:
                async with self.target.connection() as t, t.transaction():
                    await self._fence_target(t)
                    status = await t.execute(
                        f"WITH batch AS (DELETE FROM move_rows WHERE (partition, kind, id) IN"
                        f" (SELECT partition, kind, id FROM move_rows WHERE partition ="
                        f" ANY($1::smallint[]) AND kind = $2 LIMIT {DELETE_ROWS}) RETURNING id)"
                        f" DELETE FROM {tracked.table} x USING batch WHERE x.id = batch.id",
                        parts,
                        tracked.kind,
                        timeout=self.phase_timeout,
                    )
                    left = await t.fetchval(
                        "SELECT EXISTS (SELECT 1 FROM move_rows WHERE partition ="
                        " ANY($1::smallint[]) AND kind = $2)",
                        parts,
                        tracked.kind,
                    )
                del status
                if not left:
                    break
        async with self.target.connection() as t, t.transaction():
            await self._fence_target(t)
            for table in layout.replaced:
                await t.execute(
                    f"DELETE FROM {table} WHERE {self._moving}", timeout=self.phase_timeout
                )

    async def _strays(self, t: Any, layout: _Layout) -> bool:
        """Whether the target has task, schedule or history rows of the moving partitions that
        no copy of this move wrote (read through the partial indexes of each state)."""
        parts = list(self.partitions)
        return bool(
            await t.fetchval(
                "SELECT EXISTS (SELECT 1 FROM ("
                + " UNION ALL ".join(
                    f"SELECT id FROM tasks WHERE {state} AND partition = ANY($1::smallint[])"
                    for state in ("state = 0", "state = 1", "state = 2", "state >= 3")
                )
                + " UNION ALL SELECT id FROM schedules WHERE partition = ANY($1::smallint[])"
                " UNION ALL SELECT id FROM task_history WHERE partition = ANY($1::smallint[])"
                ") x WHERE NOT EXISTS (SELECT 1 FROM move_rows r"
                " WHERE r.partition = ANY($1::smallint[]) AND r.id = x.id))",
                parts,
                timeout=self.phase_timeout,
            )
        )

    async def _delete_source(self, statement: str) -> int:
        deleted = 0
        while True:
            async with self.source.connection() as s, s.transaction():
                await self._fence(s, self.source, (GONE,))
                count = _copied(await s.execute(statement, timeout=self.phase_timeout))
            deleted += count
            if count < DELETE_ROWS:
                return deleted

    async def _build_index(self) -> None:
        """The source's index of the moving rows, built without blocking its writers
        (CONCURRENTLY: two passes over the table). An invalid one left by a cancelled
        build is dropped and built again."""
        async with self.source.connection() as s:
            valid = await s.fetchval(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", self.index
            )
            if valid is False:
                await s.execute(
                    f"DROP INDEX CONCURRENTLY IF EXISTS {self.index}", timeout=self.phase_timeout
                )
            if valid is not True:
                await s.execute(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {self.index} ON tasks (partition, id)"
                    f" WHERE {self._index_predicate}",
                    timeout=self.phase_timeout,
                )

    async def _drop_index(self) -> None:
        if self.is_group and not self._owns_index:
            return  # the rest of the move still reads through it
        async with self.source.connection() as s:
            await s.execute(
                f"DROP INDEX CONCURRENTLY IF EXISTS {self.index}", timeout=self.phase_timeout
            )

    # -- schema ----------------------------------------------------------------------------

    async def _load_layout(self) -> _Layout:
        """Both shards at the same migrations, the copied tables' columns alike (read once)."""
        if self._layout is not None:
            return self._layout
        async with self.source.connection() as s, self.target.connection() as t:
            versions = [
                await c.fetchval(
                    "SELECT array_agg(version ORDER BY version) FROM schema_migrations"
                )
                for c in (s, t)
            ]
            if versions[0] != versions[1]:
                raise MoveRefused(
                    f"the shards are at different migrations (source {_last(versions[0])}, "
                    f"target {_last(versions[1])}): migrate both to this release first"
                )
            columns: dict[str, tuple[str, ...]] = {}
            replaced: list[str] = []
            for table in (*(x.table for x in _TRACKED), *_REPLACED):
                mine, theirs = await _columns(s, table), await _columns(t, table)
                if mine != theirs:
                    raise MoveRefused(
                        f"table {table} differs between the shards: migrate both to this "
                        "release first"
                    )
                if mine:
                    columns[table] = tuple(name for name, _ in mine)
                    if table in _REPLACED:
                        replaced.append(table)
        self._layout = _Layout(columns, tuple(replaced))
        return self._layout

    @contextlib.asynccontextmanager
    async def _phase(self, name: str) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(self.phase_timeout):
                yield
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"move {self.move_id!r}: {name} did not finish within {self.phase_timeout:g} s;"
                " it can be run again"
            ) from exc
