"""Moving partitions between two store shards while they are written.

The store half of an online move (docs/design/shards.md, "An online move"); the driver that
records the phases in etcd and commits the map is the coordinator's. Each phase is a method,
restartable after a crash at any point, and fenced by the move's token on the shard that
holds the partitions' fate (``shard_partitions``, ``chronoq.store.holdings``)::

    prepare()        both shards at one migration; the target's rows INCOMING; the source's
                     move index (partition, id) over the moving partitions, built CONCURRENTLY
    copy()           one REPEATABLE READ snapshot of the source, COPY (binary) streamed into
                     the target through a byte-bounded pipe; the target records each row's
                     source xmin (``move_rows``)
    catch_up()       one round: rows whose xmin changed, or new, are copied again, rows gone
                     are deleted; returns how many
    cut_over(v)      the source FROZEN (waits for writes in flight), a last round, the target
                     LIVE since map version v; then the caller commits map v in etcd
    rollback()       before that commit: the target back to INCOMING, its copies deleted, the
                     source LIVE again
    clean_up()       after it: the source's rows deleted in batches, its holdings GONE

A row is never live on both shards: the target is live (since v) only while the source is
frozen, and no node passes the target's check before it routes by v. Memory does not grow
with a partition's rows: every stream goes through a pipe of ``buffer_bytes``, every id list
is a batch of ``batch_rows``, and diffs are computed by the target's server in temporary
tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from chronoq.errors import ChronoqError, InvalidArgument, StoreUnavailable
from chronoq.shardmap import format_partitions
from chronoq.store.connection import Connected

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
#: How much longer than its budget a frozen last round may take before it gives the
#: partitions back to the source (the design record's "freeze_budget x 5").
FREEZE_OVERRUN = 5.0
#: A move id: it names the move's index and appears in shard_partitions.
_MOVE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")

# States of shard_partitions (migration 0011).
LIVE, FROZEN, INCOMING, GONE = 0, 1, 2, 3


class MoveRefused(ChronoqError):
    """The partition move cannot take this step in the shards' present state."""

    grpc_code = "FAILED_PRECONDITION"


class StaleMoveToken(MoveRefused):
    """A newer mover of these partitions holds them: this one's token is stale."""

    def __init__(self, move_id: str, token: int, current: int) -> None:
        self.move_id = move_id
        self.token = token
        self.current = current
        super().__init__(
            f"move {move_id!r}: token {token} is stale, the partitions were taken by a mover "
            f"with token {current}; this mover stops"
        )


class FreezeOverrun(StoreUnavailable):
    """The frozen last round took longer than its budget allows: the partitions are live on
    the source again (move fewer partitions per cut-over, or catch up once more first)."""


class Holdings(Protocol):
    """The statements over ``shard_partitions`` a move takes (``chronoq.store.holdings``):
    each checks the move's token and refuses a stale one."""

    async def held(self, store: Any) -> dict[int, Any]: ...

    async def mark_incoming(
        self, store: Any, partitions: Sequence[int], move_id: str, token: int
    ) -> Any: ...

    async def freeze(
        self, store: Any, partitions: Sequence[int], move_id: str, token: int
    ) -> Any: ...

    async def make_live(
        self, store: Any, partitions: Sequence[int], since_version: int, move_id: str, token: int
    ) -> Any: ...

    async def mark_gone(
        self, store: Any, partitions: Sequence[int], move_id: str, token: int
    ) -> Any: ...

    async def unfreeze(
        self, store: Any, partitions: Sequence[int], move_id: str, token: int
    ) -> Any: ...


def store_holdings() -> Holdings:
    """The store's own holdings statements (imported when a move first needs them)."""
    module: Holdings = importlib.import_module("chronoq.store.holdings")
    return module


@dataclass(frozen=True)
class Round:
    """What one catch-up round did and read."""

    listed: int  # rows of the moving partitions on the source
    changed: int  # rows copied again, new or deleted on the target
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.listed / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class CutOver:
    """The outcome of a cut-over: how long the source's partitions were frozen."""

    next_version: int
    changed: int  # rows the frozen last round copied or deleted
    frozen_seconds: float


@dataclass(frozen=True)
class _Tracked:
    """A table whose rows a round compares one by one (uuid id, partition column)."""

    table: str
    kind: int


#: The routes to tasks made before routing (``chronoq.store.legacy``) are tracked like tasks:
#: there can be one per such task, too many to copy whole in the frozen last round.
_TRACKED = (_Tracked("tasks", 0), _Tracked("schedules", 1), _Tracked("legacy_routes", 2))
#: Tables keyed by partition whose rows of the moving partitions are copied whole each round
#: (one row per partition or a few): the fences.
_REPLACED = ("partition_fences",)


def index_name(move_id: str) -> str:
    """The source's index of one move (a hash: any move id makes a valid identifier)."""
    return "move_" + hashlib.blake2b(move_id.encode(), digest_size=8).hexdigest()


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _Pipe:
    """Bytes from one COPY ... TO STDOUT to one COPY ... FROM STDIN, at most ``limit`` held
    (one chunk more than that when the pipe is empty: a row larger than the bound)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._held = 0
        self._closed = False
        self._error: BaseException | None = None
        self._changed = asyncio.Condition()
        self.on_progress: Any = None  # called whenever bytes go in or out

    async def put(self, data: bytes) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: (
                    self._error is not None
                    or self._held == 0
                    or self._held + len(data) <= self._limit
                )
            )
            if self._error is not None:
                raise self._error
            self._chunks.append(bytes(data))
            self._held += len(data)
            self._changed.notify_all()
            if self.on_progress is not None:
                self.on_progress()

    async def close(self, error: BaseException | None = None) -> None:
        async with self._changed:
            self._closed = True
            if error is not None and self._error is None:
                self._error = error
            self._changed.notify_all()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._read()

    async def _read(self) -> AsyncIterator[bytes]:
        while True:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: bool(self._chunks) or self._closed or self._error is not None
                )
                if self._error is not None:
                    raise self._error
                if not self._chunks:
                    return
                chunk = self._chunks.popleft()
                self._held -= len(chunk)
                self._changed.notify_all()
                if self.on_progress is not None:
                    self.on_progress()
            yield chunk


def _copied(status: str) -> int:
    """Rows of a ``COPY n`` status."""
    return int(status.split()[-1]) if status else 0


async def _both(first: Awaitable[Any], second: Awaitable[Any]) -> tuple[Any, Any]:
    """Run two halves of a stream; the first failure cancels the other and is raised."""
    a = asyncio.ensure_future(first)
    b = asyncio.ensure_future(second)
    try:
        done, _ = await asyncio.wait((a, b), return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return await a, await b
    finally:
        for task in (a, b):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


class PartitionMove:
    """One move of ``partitions`` from ``source`` to ``target`` under ``token`` (the create
    revision of the driver's move key in etcd: a newer driver's token is larger).

    Every method is one phase, safe to call again after a crash or cancellation in it.
    """

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
        self.last_round: Round | None = None
        self._given_holdings = holdings
        self._owns_index = False

        self._layout: _Layout | None = None

    @property
    def is_group(self) -> bool:
        """Whether this mover is a part of a larger move (it leaves the move index alone)."""
        return self.index_partitions != self.partitions

    def group(self, partitions: Sequence[int], *, owns_index: bool = False) -> PartitionMove:
        """The same move restricted to ``partitions`` (some of its own): the driver cuts a
        large move over a group at a time, each frozen step sized to fit the budget.
        ``owns_index``: this group's rollback or clean-up is the move's last step, and drops
        the move index (otherwise the rest of the move still reads through it)."""
        part = PartitionMove(
            self.source,
            self.target,
            partitions,
            self.move_id,
            self.token,
            freeze_budget=self.freeze_budget,
            buffer_bytes=self.buffer_bytes,
            batch_rows=self.batch_rows,
            phase_timeout=self.phase_timeout,
            holdings=self._given_holdings,
            index_partitions=self.index_partitions,
            stall_timeout=self.stall_timeout,
        )
        part._owns_index = owns_index
        return part

    @property
    def _holdings_ops(self) -> Holdings:
        if self._given_holdings is None:
            self._given_holdings = store_holdings()
        return self._given_holdings

    # -- phases ----------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Check both shards, mark the target's partitions incoming, build the move index.

        Refused (``MoveRefused``) when the shards are at different migrations, when the source
        does not hold every partition live (or frozen by this move), or when the target holds
        rows of them that no move copied (an earlier move's source not cleaned up yet).
        """
        async with self._phase("prepare"):
            layout = await self._load_layout()
            source = await self._holdings_ops.held(self.source)
            for p in self.partitions:
                held = source.get(p)
                if held is None or not (
                    held.state == LIVE or (held.state == FROZEN and held.move_id == self.move_id)
                ):
                    raise MoveRefused(
                        f"move {self.move_id!r}: the source shard does not hold partition {p} "
                        f"live ({_shown(held)}); nothing was changed"
                    )
            async with self.target.connection() as t:
                if await self._strays(t, layout):
                    raise MoveRefused(
                        f"move {self.move_id!r}: the target shard still has rows of partitions "
                        f"{_span(self.partitions)} that no move copied (an earlier move out of "
                        "it not cleaned up); clean that move up first"
                    )
            await self._holdings_ops.mark_incoming(
                self.target, self.partitions, self.move_id, self.token
            )
            await self._build_index()

    async def copy(self) -> int:
        """Copy every row of the moving partitions, as of one snapshot of the source, into the
        target (emptied of earlier copies first); returns the task and schedule rows copied.
        One transaction on the target: a copy cut short leaves nothing behind."""
        async with self._phase("copy"):
            layout = await self._load_layout()
            await self._empty_target()
            copied = 0
            async with self.source.connection() as s, self.target.connection() as t:
                async with s.transaction(isolation="repeatable_read", readonly=True):
                    await s.execute(_IDLE)
                    async with t.transaction():
                        await t.execute(_IDLE)
                        await self._fence_target(t)
                        for tracked in _TRACKED:
                            cols = layout.columns[tracked.table]
                            copied += await self._stream(
                                s,
                                f"SELECT {_list(cols)} FROM {tracked.table} WHERE {self._moving}",
                                (),
                                t,
                                tracked.table,
                                cols,
                            )
                            await self._stream(
                                s,
                                f"SELECT partition, {tracked.kind}::smallint, id, "
                                f"xmin::text::bigint FROM {tracked.table} WHERE {self._moving}",
                                (),
                                t,
                                "move_rows",
                                _MOVE_ROWS,
                            )
                        await self._replace(s, t, layout)
            return copied

    async def catch_up(self) -> int:
        """One round: rows of the moving partitions that changed on the source since they
        were copied (their xmin differs), or are new, are copied again; rows deleted there
        are deleted here. Returns the rows changed; the caller repeats while it falls."""
        async with self._phase("catch up"):
            return (await self._round()).changed

    async def cut_over(self, next_version: int) -> CutOver:
        """Freeze the source's partitions (waits for the writes in flight, refuses new ones),
        run the last round, and make the target live since ``next_version``. The caller
        then commits map ``next_version`` in etcd: the commit point.

        When the frozen step outlasts ``freeze_budget`` x 5 the partitions are given back
        to the source (``FreezeOverrun``): the move stays caught up, ready for another try.
        """
        if next_version < 2:
            raise InvalidArgument(
                "next_version", f"a moved map is version 2 or later, got {next_version}"
            )
        async with self._phase("cut over"):
            await self._load_layout()
            target = await self._holdings(self.target)
            if all(
                h is not None
                and h.state == LIVE
                and h.move_id == self.move_id
                and h.since_version == next_version
                for h in target
            ):
                return CutOver(next_version, 0, 0.0)  # done before a crash: nothing to redo
            started = time.monotonic()
            await self._holdings_ops.freeze(self.source, self.partitions, self.move_id, self.token)
            try:
                async with asyncio.timeout(
                    max(0.0, self.freeze_budget * FREEZE_OVERRUN - (time.monotonic() - started))
                ):
                    last = await self._round()
                    await self._holdings_ops.make_live(
                        self.target, self.partitions, next_version, self.move_id, self.token
                    )
            except TimeoutError:
                frozen = time.monotonic() - started
                await self._give_back()
                raise FreezeOverrun(
                    f"move {self.move_id!r}: the frozen last round took over {frozen:.1f} s "
                    f"(budget {self.freeze_budget:g} s x {FREEZE_OVERRUN:g}); partitions "
                    f"{_span(self.partitions)} are live on the source again: cut over fewer "
                    "partitions at a time, or catch up once more first"
                ) from None
            return CutOver(next_version, last.changed, time.monotonic() - started)

    async def rollback(self) -> None:
        """Undo the move before its commit: the target's partitions back to incoming (first:
        from then on no node can write there), its copies deleted, the source's partitions
        live again, the move index dropped. Refused once the source's rows are gone."""
        async with self._phase("rollback"):
            await self._load_layout()
            source = await self._holdings(self.source)
            if any(h is not None and h.state == GONE and h.move_id == self.move_id for h in source):
                raise MoveRefused(
                    f"move {self.move_id!r} is committed and its source cleaned up: it can "
                    "only go forward (move the partitions back with a new move)"
                )
            await self._give_back()
            ours = [h for h in await self._holdings(self.target) if h and h.move_id == self.move_id]
            # None: cut short before the target was marked, nothing of this move is there;
            # all gone: rolled back there already.
            if ours and not all(h.state == GONE for h in ours):
                if any(h.move_token != self.token for h in ours):
                    # Left by a driver that died: stamped with this (newer) token first, so
                    # that the fenced deletes below are this mover's.
                    await self._holdings_ops.mark_incoming(
                        self.target, self.partitions, self.move_id, self.token
                    )
                await self._empty_target()
                await self._holdings_ops.mark_gone(
                    self.target, self.partitions, self.move_id, self.token
                )
            await self._drop_index()

    async def clean_up(self) -> int:
        """After the commit: the source's holdings of the moved partitions gone, their rows
        deleted in batches (fenced: a later move back onto the source is never touched), the
        target's move bookkeeping deleted, the move index dropped. Returns the rows deleted.

        The caller waits first until every node routes by the new map and the longest
        statement deadline has passed (readers of the old map still page the source)."""
        async with self._phase("clean up"):
            layout = await self._load_layout()
            target = await self._holdings(self.target)
            if not all(
                h is not None and h.state == LIVE and h.move_id == self.move_id for h in target
            ):
                raise MoveRefused(
                    f"move {self.move_id!r}: the target does not hold partitions "
                    f"{_span(self.partitions)} live for this move; cut over (and commit) first"
                )
            # Committed by a driver that died: this (newer) token takes them over, each at
            # the version it was made live (a move cut over in groups has one per group).
            stale: dict[int, list[int]] = {}
            for p, h in zip(self.partitions, target, strict=True):
                if h is not None and h.move_token != self.token:
                    stale.setdefault(h.since_version, []).append(p)
            for since, parts in sorted(stale.items()):
                await self._holdings_ops.make_live(
                    self.target, parts, since, self.move_id, self.token
                )
            await self._holdings_ops.mark_gone(
                self.source, self.partitions, self.move_id, self.token
            )
            deleted = 0
            for tracked in _TRACKED:
                deleted += await self._delete_source(
                    f"DELETE FROM {tracked.table} WHERE id IN (SELECT id FROM {tracked.table} "
                    f"WHERE {self._moving} LIMIT {DELETE_ROWS})"
                )
            for table in layout.replaced:
                await self._delete_source(f"DELETE FROM {table} WHERE {self._moving}")
            while True:
                async with self.target.connection() as t, t.transaction():
                    await self._fence(t, self.target, (LIVE,))
                    status = await t.execute(
                        "DELETE FROM move_rows WHERE (partition, kind, id) IN (SELECT partition,"
                        " kind, id FROM move_rows WHERE partition = ANY($1::smallint[]) LIMIT "
                        f"{DELETE_ROWS})",
                        list(self.partitions),
                        timeout=self.phase_timeout,
                    )
                if _copied(status) == 0:
                    break
            await self._drop_index()
            return deleted

    # -- rounds ----------------------------------------------------------------------------

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
            f"SELECT partition, id, xmin::text::bigint FROM {tracked.table} WHERE {self._moving}",
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
        for lo in range(0, fresh, self.batch_rows):
            ids = [
                r["id"]
                for r in await t.fetch(
                    "SELECT id FROM chronoq_move_changed WHERE n > $1 AND n <= $2",
                    lo,
                    lo + self.batch_rows,
                    timeout=self.phase_timeout,
                )
            ]
            await t.execute(f"TRUNCATE {stage}", timeout=self.phase_timeout)
            await self._stream(
                s,
                f"SELECT {_list(cols)}, xmin::text::bigint FROM {tracked.table}"
                f" WHERE id = ANY($1::uuid[]) AND {self._moving}",
                (ids,),
                t,
                stage,
                (*cols, "chronoq_source_xmin"),
            )
            async with t.transaction():
                await self._fence_target(t)
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
                await self._translate_unique(
                    t.execute(
                        f"INSERT INTO {tracked.table} ({_list(cols)}) SELECT {_list(cols)}"
                        f" FROM {stage}",
                        timeout=self.phase_timeout,
                    )
                )
                await t.execute(
                    f"INSERT INTO move_rows (partition, kind, id, source_xmin) SELECT partition,"
                    f" {kind}::smallint, id, chronoq_source_xmin FROM {stage}",
                    timeout=self.phase_timeout,
                )
        return listed, gone + fresh

    async def _replace(self, s: Any, t: Any, layout: _Layout) -> None:
        """The small tables keyed by partition, copied whole (inside the callers'
        transactions)."""
        for table in layout.replaced:
            cols = layout.columns[table]
            await t.execute(f"DELETE FROM {table} WHERE {self._moving}", timeout=self.phase_timeout)
            await self._stream(
                s, f"SELECT {_list(cols)} FROM {table} WHERE {self._moving}", (), t, table, cols
            )

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
        """Whether the target has task or schedule rows of the moving partitions that no copy
        of this move wrote (read through the partial indexes of each state)."""
        parts = list(self.partitions)
        return bool(
            await t.fetchval(
                "SELECT EXISTS (SELECT 1 FROM ("
                + " UNION ALL ".join(
                    f"SELECT id FROM tasks WHERE {state} AND partition = ANY($1::smallint[])"
                    for state in ("state = 0", "state = 1", "state = 2", "state >= 3")
                )
                + " UNION ALL SELECT id FROM schedules WHERE partition = ANY($1::smallint[])"
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


@dataclass(frozen=True)
class _Layout:
    columns: dict[str, tuple[str, ...]]
    replaced: tuple[str, ...]


_MOVE_ROWS = ("partition", "kind", "id", "source_xmin")
_STATES = {LIVE: "live", FROZEN: "frozen", INCOMING: "incoming", GONE: "gone"}
#: A transaction of the mover waits on the other server between statements: longer than the
#: store's 1 s idle bound, still bounded for a mover that died in one.
_IDLE = "SET LOCAL idle_in_transaction_session_timeout = '30s'"
_TEMP = """
CREATE TEMP TABLE IF NOT EXISTS chronoq_move_seen
    (partition smallint NOT NULL, id uuid NOT NULL, source_xmin bigint NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS chronoq_move_gone
    (n bigint PRIMARY KEY, partition smallint NOT NULL, id uuid NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS chronoq_move_changed (n bigint PRIMARY KEY, id uuid NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS chronoq_move_stage_{table} (LIKE {table});
ALTER TABLE chronoq_move_stage_{table} ADD COLUMN IF NOT EXISTS chronoq_source_xmin bigint;
TRUNCATE chronoq_move_seen, chronoq_move_gone, chronoq_move_changed, chronoq_move_stage_{table};
"""
_DROP_TEMP = (
    "DROP TABLE IF EXISTS chronoq_move_seen, chronoq_move_gone, chronoq_move_changed,"
    " chronoq_move_stage_tasks, chronoq_move_stage_schedules,"
    " chronoq_move_stage_legacy_routes"
)


async def _columns(conn: Any, table: str) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type FROM pg_attribute a"
        " WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY a.attnum",
        table,
    )
    return [(r["attname"], r["type"]) for r in rows]


def _list(columns: Sequence[str]) -> str:
    return ", ".join(_ident(c) for c in columns)


def _count(status: str) -> int:
    """Rows of an ``INSERT 0 n`` / ``DELETE n`` status."""
    return int(status.split()[-1]) if status else 0


def _last(versions: Sequence[int] | None) -> str:
    return str(versions[-1]) if versions else "none"


def _span(partitions: Sequence[int]) -> str:
    return format_partitions(partitions)


def _shown(held: Any) -> str:
    if held is None:
        return "not held"
    state = _STATES.get(held["state"] if isinstance(held, asyncpg.Record) else held.state, "?")
    move = held["move_id"] if isinstance(held, asyncpg.Record) else held.move_id
    return f"{state}" + (f" for move {move!r}" if move else "")
