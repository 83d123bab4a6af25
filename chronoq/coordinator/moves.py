"""The move driver: runs online moves of partitions between store shards, phase by phase.

One node drives at a time: the one that ``leads()``, and only for a record whose move key it
holds (``/chronoq/<cluster>/move-keys/<id>``, created only if absent, on its lease; the key's
create revision is the *move token* the shards check, so a driver whose lease lapsed is
refused by the store). Every record write compares that key too: a driver that lost its key
cannot write the record either. The record is written *before* each phase acts
(``chronoq.moves``), the commit is one etcd transaction (map v+1 and the record's phase
``committed``, comparing the map's and the record's mod revisions and the move key), and the
source's copy is removed only once every live member routes by v+1 and the longest statement
deadline has passed. A record left behind by a dead driver is rolled back before the commit
and finished after it, by whoever leads next.

The etcd side is the ``MoveBook`` port (``chronoq.coordinator.move_book``; the unit tests give
a fake), the shards' side the mover (``chronoq.store.mover.PartitionMove``), made by a factory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from chronoq.coordinator.move_book import MoveBook, MoveLost, Stored
from chronoq.errors import ChronoqError, CoordinatorUnavailable, StoreUnavailable
from chronoq.moves import (
    AFTER_COMMIT,
    MoveRecord,
    MoveRecordInvalid,
    Phase,
    Recovery,
    cut_over_groups,
    recovery,
)
from chronoq.redact import mask_text
from chronoq.shardmap import Move, ShardMapConflict, ShardMapInvalid, format_partitions
from chronoq.store.mover import FreezeOverrun

log = logging.getLogger("chronoq.moves")

#: A catch-up round that changed at most this many rows is small enough to cut over after.
SMALL_ROUND = 500
#: Catch-up rounds at most before the cut-over, however busy the partitions are (the frozen
#: last round copies what is left).
MAX_ROUNDS = 20
#: The longest a statement routed under the old map may still run (the store's
#: ``command_timeout``): the source's rows stay until it has passed since the commit.
STATEMENT_DEADLINE = 15.0
#: A source frozen this many freeze budgets without a commit is rolled back.
FREEZE_LIMIT_BUDGETS = 5
#: Seconds one pass waits for members to report the new map before it lets the loop go on.
ACK_WAIT = 10.0


class PartitionMover(Protocol):
    """The shards' side of one move (``chronoq.store.mover.PartitionMove``)."""

    async def prepare(self) -> Any: ...

    async def copy(self) -> Any: ...

    async def catch_up(self) -> int: ...

    async def cut_over(self, next_version: int) -> Any: ...

    async def rollback(self) -> Any: ...

    async def clean_up(self) -> int: ...


#: (source store, target store, partitions, move id, token) -> the move's mover.
MoverFactory = Callable[[Any, Any, tuple[int, ...], str, int], PartitionMover]


class ShardStores(Protocol):
    """The stores of the shards, by name (opened when first asked for)."""

    async def store(self, shard: str) -> Any: ...


class MoveDriver:
    """Runs move records, one at a time, on the leading node (see the module docstring)."""

    def __init__(
        self,
        book: MoveBook,
        stores: ShardStores,
        make_move: MoverFactory,
        *,
        node_id: str,
        leads: Callable[[], bool],
        freeze_budget: float = 1.0,
        statement_deadline: float = STATEMENT_DEADLINE,
        small_round: int = SMALL_ROUND,
        max_rounds: int = MAX_ROUNDS,
        ack_wait: float = ACK_WAIT,
        now: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._book = book
        self._stores = stores
        self._make_move = make_move
        self.node_id = node_id
        self._leads = leads
        self.freeze_budget = freeze_budget
        self.statement_deadline = statement_deadline
        self.small_round = small_round
        self.max_rounds = max_rounds
        self.ack_wait = ack_wait
        self._now = now
        self._mono = monotonic
        self._sleep = sleep
        self._mine: dict[str, int] = {}  # move id -> token of the keys this node holds
        #: (group, seconds frozen) of the last cut-overs this node drove (newest last).
        self.frozen: deque[tuple[tuple[int, ...], float]] = deque(maxlen=256)
        self.wake = asyncio.Event()

    # ------------------------------------------------------------------ the loop

    async def step(self) -> MoveRecord | None:
        """One pass: drive the oldest open record this node may drive; the record after."""
        if not self._leads() and not self._mine:
            return None
        try:
            stored = await self._book.records()
        except MoveRecordInvalid as exc:  # pragma: no cover - the book skips these
            log.error("%s", exc)
            return None
        open_ = [s for s in stored if not s.record.final]
        for gone in set(self._mine) - {s.record.id for s in open_}:
            self._mine.pop(gone, None)
        for s in open_:
            rec = s.record
            token = self._mine.get(rec.id)
            if token is None:
                if not self._leads():
                    return None
                if await self._book.held(rec.id):
                    return None  # another node drives it: one move at a time
                token = await self._book.claim(rec.id)
                if token is None:
                    return None
                self._mine[rec.id] = token
                if rec.driver and rec.driver != self.node_id and rec.phase is not Phase.REQUESTED:
                    log.warning(
                        "move %s: taking over from %s in phase %s", rec.id, rec.driver, rec.phase
                    )
            return await self.drive(s, token)
        return None

    async def drive(self, stored: Stored, token: int) -> MoveRecord:
        """Take ``stored`` as far as it goes now: to a final phase, or to ``committed`` while
        members have not all read the new map (a later pass finishes it)."""
        rec, rev = stored.record, stored.mod_revision
        action = recovery(rec.phase)
        try:
            if action is Recovery.START:
                rec, rev = await self._forward(rec, rev, token)
            elif action is Recovery.ROLL_BACK:
                reason = rec.error or (
                    f"interrupted in phase {rec.phase.value} (its driver stopped)"
                    if rec.driver != self.node_id or rec.token != token
                    else f"failed in phase {rec.phase.value}"
                )
                rec, rev = await self._roll_back(rec, rev, token, reason)
            if rec.phase in AFTER_COMMIT:
                rec, rev = await self._finish(rec, rev, token)
        except MoveLost:
            self._mine.pop(rec.id, None)
            log.warning("move %s: lost its key; the next leader takes it over", rec.id)
            return rec
        if rec.final:
            self._mine.pop(rec.id, None)
            with contextlib.suppress(CoordinatorUnavailable):
                await self._book.release(rec.id, token)
        return rec

    # ------------------------------------------------------------------ phases

    async def _write(
        self, rec: MoveRecord, phase: Phase, token: int, **changes: Any
    ) -> tuple[MoveRecord, int]:
        new = rec.at(phase, self._now(), driver=self.node_id, token=token, **changes)
        return new, await self._book.put(new, token)

    async def _mover(self, rec: MoveRecord, token: int) -> PartitionMover:
        source = await self._stores.store(rec.source)
        target = await self._stores.store(rec.target)
        return self._make_move(source, target, rec.partitions, rec.id, token)

    async def _forward(self, rec: MoveRecord, rev: int, token: int) -> tuple[MoveRecord, int]:
        current, _ = await self._book.read_map()
        try:
            current.moved(rec.move)
        except (ShardMapConflict, ShardMapInvalid) as exc:
            return await self._write(rec, Phase.ROLLED_BACK, token, error=exc.message)
        rec, rev = await self._write(rec, Phase.PREPARE, token)
        try:
            mover = await self._mover(rec, token)
            await mover.prepare()
            rec, rev = await self._write(rec, Phase.COPY, token)
            copied = await mover.copy()
            rows = copied if isinstance(copied, int) else 0
            rec, rev = await self._write(rec, Phase.CATCH_UP, token, rows_copied=rows)
            for _ in range(self.max_rounds):
                changed = await mover.catch_up()
                rec, rev = await self._write(
                    rec,
                    Phase.CATCH_UP,
                    token,
                    rows_copied=rec.rows_copied + changed,
                    rounds=rec.rounds + 1,
                )
                if changed <= self.small_round:
                    break
            return await self._cut_over(rec, rev, token, mover)
        except MoveLost:
            raise
        except (ChronoqError, OSError) as exc:
            # A shard or etcd failed, or the map changed under the move: undo it.
            # A shard's error may quote its DSN: the record is shown by Status and the console.
            reason = mask_text(exc.message if isinstance(exc, ChronoqError) else str(exc))
            log.warning("move %s failed in phase %s: %s", rec.id, rec.phase.value, reason)
            latest = await self._book.get(rec.id)
            if latest is not None and latest.record.phase in AFTER_COMMIT:
                return latest.record, latest.mod_revision
            if latest is not None:  # it says which groups were committed meanwhile
                rec, rev = latest.record, latest.mod_revision
            return await self._roll_back(
                rec, rev, token, f"failed in phase {rec.phase.value}: {reason}"
            )

    async def _cut_over(
        self, rec: MoveRecord, rev: int, token: int, mover: PartitionMover
    ) -> tuple[MoveRecord, int]:
        """Cut the move over a group at a time, each group sized from the last catch-up
        round's rows/s so that its frozen step fits ``freeze_budget``; each group is its own
        commit (map v+1 with the group moved). A group that overruns its freeze is split in
        two and tried again (the source is live again meanwhile)."""
        last = getattr(mover, "last_round", None)
        pending = (
            cut_over_groups(
                rec.remaining,
                int(last.listed),
                float(last.seconds),
                self.freeze_budget,
                listed_partitions=len(rec.remaining),
            )
            if last is not None
            else [rec.remaining]
        )
        if len(pending) > 1 and last is not None:
            log.info(
                "move %s: cutting over in %d groups of up to %d partitions (last round %d rows "
                "in %.2f s)",
                rec.id, len(pending), max(map(len, pending)), last.listed, last.seconds,
            )  # fmt: skip
        while pending:
            group = pending.pop(0)
            current, _ = await self._book.read_map()
            current.moved(Move(group, rec.source, rec.target))
            rec, rev = await self._write(
                rec, Phase.CUT_OVER, token, next_version=current.version + 1, group=group
            )
            part = mover if group == rec.partitions else _group_of(mover, group)
            started = self._mono()
            try:
                frozen = await part.cut_over(rec.next_version)
            except FreezeOverrun as exc:
                if len(group) == 1:
                    raise
                half = len(group) // 2
                pending[:0] = [group[:half], group[half:]]
                log.warning("move %s: %s; splitting the group", rec.id, exc.message)
                rec, rev = await self._write(rec, Phase.CATCH_UP, token, group=())
                continue
            seconds = getattr(frozen, "frozen_seconds", None)
            if isinstance(seconds, float):
                self.frozen.append((group, seconds))
            rec, rev = await self._commit(rec, rev, token, started, final=not pending)
        return rec, rev

    async def _commit(
        self, rec: MoveRecord, rev: int, token: int, started: float, *, final: bool = True
    ) -> tuple[MoveRecord, int]:
        """The commit point of ``rec.group`` (the whole move, or one group of it; the last
        group's makes the record ``committed``); retried while etcd does not answer, up to
        the freeze limit."""
        limit = started + FREEZE_LIMIT_BUDGETS * self.freeze_budget
        group = rec.group or rec.remaining
        cut = tuple(sorted({*rec.cut, *group}))
        committed = rec.at(
            Phase.COMMITTED if final else Phase.CATCH_UP,
            self._now(),
            driver=self.node_id,
            token=token,
            committed_at=self._now(),
            cut=cut,
            group=(),
        )
        while True:
            try:
                latest = await self._book.get(rec.id)
                if latest is not None and (
                    latest.record.phase in AFTER_COMMIT or set(group) <= set(latest.record.cut)
                ):
                    return latest.record, latest.mod_revision  # an answer lost on the way
                current, map_rev = await self._book.read_map()
                if current.version + 1 != rec.next_version:
                    raise ShardMapConflict(
                        f"the shard map changed during the cut-over (now version "
                        f"{current.version}): run the move again"
                    )
                new_map = current.moved(Move(group, rec.source, rec.target))
                if latest is None or latest.mod_revision != rev:
                    raise MoveLost(f"move {rec.id}: its record changed under the commit")
                if await self._book.commit(committed, rev, new_map, map_rev, token):
                    log.info(
                        "move %s committed %s partitions %s: map version %d",
                        rec.id, "its last" if final else "the", format_partitions(group),
                        new_map.version,
                    )  # fmt: skip
                    stored = await self._book.get(rec.id)
                    return committed, stored.mod_revision if stored is not None else rev
            except CoordinatorUnavailable as exc:
                log.warning("move %s: commit not confirmed (%s); retrying", rec.id, exc)
            if self._mono() > limit:
                raise StoreUnavailable(
                    f"the commit did not go through within {FREEZE_LIMIT_BUDGETS} freeze "
                    "budgets of the cut-over"
                )
            await self._sleep(min(0.1, self.freeze_budget / 10))

    async def _roll_back(
        self, rec: MoveRecord, rev: int, token: int, reason: str
    ) -> tuple[MoveRecord, int]:
        """Undo what is not committed. Groups committed before go forward: the rest goes
        back to the source, and the record then finishes as a move of the committed ones."""
        rec, _ = await self._write(rec, Phase.ROLLING_BACK, token, error=reason)
        mover = await self._mover(rec, token)
        if not rec.cut:
            await mover.rollback()
            log.warning("move %s rolled back: %s", rec.id, reason)
            return await self._write(rec, Phase.ROLLED_BACK, token)
        back = rec.remaining
        if back:
            await _group_of(mover, back).rollback()
        log.warning(
            "move %s: partitions %s rolled back (%s); %s committed before go forward",
            rec.id, format_partitions(back) or "none", reason, format_partitions(rec.cut),
        )  # fmt: skip
        current, _ = await self._book.read_map()
        return await self._write(
            rec,
            Phase.COMMITTED,
            token,
            returned=tuple(sorted({*rec.returned, *back})),
            group=(),
            next_version=current.version,  # the last group's commit, or a later map
            committed_at=rec.committed_at or self._now(),
        )

    async def _finish(self, rec: MoveRecord, rev: int, token: int) -> tuple[MoveRecord, int]:
        """Clean the source once every member routes by the new map and the longest
        statement routed by the old one has ended; otherwise leave it for a later pass."""
        if rec.phase is Phase.COMMITTED:
            deadline = self._mono() + self.ack_wait
            while True:
                behind = self.behind(rec.next_version)
                drained = self._now() >= rec.committed_at + self.statement_deadline
                if not behind and drained:
                    break
                if self._mono() >= deadline:
                    log.info(
                        "move %s: waiting for %s",
                        rec.id,
                        f"members {', '.join(sorted(behind)[:8])}" if behind else "deadlines",
                    )
                    return rec, rev
                await self._sleep(0.2)
            rec, rev = await self._write(rec, Phase.CLEAN_UP, token)
        mover = await self._mover(rec, token)
        if rec.returned:  # partly rolled back: clean up only what was committed
            mover = _group_of(mover, rec.cut, owns_index=True)
        await mover.clean_up()
        return await self._write(rec, Phase.DONE, token)

    def behind(self, version: int) -> list[str]:
        """Live members that have not reported routing by ``version`` yet."""
        return [n for n, v in self._book.map_versions().items() if v is None or v < version]


def _group_of(
    mover: PartitionMover, partitions: tuple[int, ...], *, owns_index: bool = False
) -> PartitionMover:
    """The mover of some of a move's partitions (``PartitionMove.group``)."""
    group = getattr(mover, "group", None)
    if group is None:
        return mover  # a mover that moves all or nothing (the unit tests' fake)
    part: PartitionMover = group(partitions, owns_index=owns_index)
    return part
