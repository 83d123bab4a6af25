"""Moving partitions between two store shards while they are written.

The store half of an online move (docs/design/shards.md, "An online move"); the driver that
records the phases in etcd and commits the map is the coordinator's. Each phase is a method,
restartable after a crash at any point, and fenced by the move's token on the shard that
holds the partitions' fate (``shard_partitions``, ``chronoq.store.holdings``)::

    prepare()        both shards at one migration; the target's rows INCOMING; the source's
                     move index (partition, id) over the moving partitions, built CONCURRENTLY
    copy()           one REPEATABLE READ snapshot of the source, COPY (binary) streamed into
                     the target through a byte-bounded pipe; the target records each row's
                     source xmin (``move_rows``); the task history's rows too, but for the
                     expired ones, into slices the target is given (``move_history``)
    catch_up()       one round: rows whose xmin changed, or new, are copied again, rows gone
                     are deleted; returns how many
    cut_over(v)      the source FROZEN (waits for writes in flight), a last round, the target
                     LIVE since map version v; then the caller commits map v in etcd
    rollback()       before that commit: the target back to INCOMING, its copies deleted, the
                     source LIVE again
    clean_up()       after it: the source's rows deleted in batches, its holdings GONE

A row is never live on both shards: the target is live (since v) only while the source is
frozen, and no node passes the target's check before it routes by v (a rollback that cannot
reach the target unfreezes the source first: v is then never committed, and no map routes
the partitions to the target). Memory does not grow
with a partition's rows: every stream goes through a pipe of ``buffer_bytes``, every id list
is a batch of ``batch_rows``, and diffs are computed by the target's server in temporary
tables.

Its parts: ``move_state`` (the holdings' states, the refusals), ``move_layout`` (the
copied tables), ``move_pipe`` (the byte-bounded pipe), ``move_steps`` (streams, fences,
rows, index), ``move_rounds`` (the catch-up diff); the phases are here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from chronoq.errors import InvalidArgument, StoreUnavailable
from chronoq.store.move_history import cover, slices
from chronoq.store.move_layout import _IDLE, _MOVE_ROWS, _TRACKED, _list, index_name
from chronoq.store.move_pipe import _copied, _Pipe
from chronoq.store.move_rounds import MoveRounds, Round
from chronoq.store.move_state import (
    FROZEN,
    GONE,
    INCOMING,
    LIVE,
    FreezeOverrun,
    Holdings,
    MoveRefused,
    StaleMoveToken,
    _shown,
    _span,
    store_holdings,
)
from chronoq.store.move_steps import (
    BATCH_ROWS,
    BUFFER_BYTES,
    DELETE_ROWS,
    PHASE_TIMEOUT,
    STALL_TIMEOUT,
    MoveSteps,
)

__all__ = [
    "BATCH_ROWS",
    "BUFFER_BYTES",
    "DELETE_ROWS",
    "FREEZE_OVERRUN",
    "FROZEN",
    "GONE",
    "INCOMING",
    "LIVE",
    "PHASE_TIMEOUT",
    "STALL_TIMEOUT",
    "CutOver",
    "FreezeOverrun",
    "Holdings",
    "MoveRefused",
    "MoveRounds",
    "MoveSteps",
    "PartitionMove",
    "Round",
    "StaleMoveToken",
    "_Pipe",
    "index_name",
    "store_holdings",
]


#: How much longer than its budget a frozen last round may take before it gives the
#: partitions back to the source (the design record's "freeze_budget x 5").
FREEZE_OVERRUN = 5.0


@dataclass(frozen=True)
class CutOver:
    """The outcome of a cut-over: how long the source's partitions were frozen."""

    next_version: int
    changed: int  # rows the frozen last round copied or deleted
    frozen_seconds: float


class PartitionMove(MoveRounds):
    """One move of ``partitions`` from ``source`` to ``target`` under ``token`` (the create
    revision of the driver's move key in etcd: a newer driver's token is larger).

    Every method is one phase, safe to call again after a crash or cancellation in it.
    """

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
        target (emptied of earlier copies first); returns the task, schedule, route and
        history rows copied (the history's expired rows stay behind).
        One transaction on the target: a copy cut short leaves nothing behind."""
        async with self._phase("copy"):
            layout = await self._load_layout()
            await self._empty_target()
            copied = 0
            async with self.source.connection() as s, self.target.connection() as t:
                async with s.transaction(isolation="repeatable_read", readonly=True):
                    await s.execute(_IDLE)
                    # The slices as of the snapshot that the rows are read in (a row it sees
                    # is in one of them), made on the target before its transaction: the
                    # DDL holds its locks for moments, not for the whole copy.
                    await cover(t, await slices(s, live_only=True))
                    async with t.transaction():
                        await t.execute(_IDLE)
                        await self._fence_target(t)
                        for tracked in _TRACKED:
                            cols = layout.columns[tracked.table]
                            rows = f"{self._moving} AND {tracked.live}"
                            copied += await self._stream(
                                s,
                                f"SELECT {_list(cols)} FROM {tracked.table} WHERE {rows}",
                                (),
                                t,
                                tracked.table,
                                cols,
                            )
                            await self._stream(
                                s,
                                f"SELECT partition, {tracked.kind}::smallint, id, "
                                f"xmin::text::bigint FROM {tracked.table} WHERE {rows}",
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
        live again, the move index dropped. Refused once the source's rows are gone. With
        the target unreachable, the source's partitions are live again at once and the call
        fails (``StoreUnavailable``): run it again once the target answers."""
        async with self._phase("rollback"):
            source = await self._holdings(self.source)
            if any(h is not None and h.state == GONE and h.move_id == self.move_id for h in source):
                raise MoveRefused(
                    f"move {self.move_id!r} is committed and its source cleaned up: it can "
                    "only go forward (move the partitions back with a new move)"
                )
            try:
                await self._load_layout()
                await self._give_back()
            except StoreUnavailable:
                # The target does not answer (or the source): the source is given back
                # first, so that the target's outage does not keep the partitions frozen
                # for as long as it lasts; the target's side is undone when this phase runs
                # again. Safe: a rollback is run only once the move's commit can no longer
                # happen (the driver's record says rolling back), so no map routes these
                # partitions to the target, and no node writes them there meanwhile.
                with contextlib.suppress(StoreUnavailable):
                    await self._unfreeze_source()
                raise
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
