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
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from chronoq.errors import ChronoqError, InvalidArgument, StoreUnavailable
from chronoq.routing import key_partition
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


_TRACKED = (_Tracked("tasks", 0), _Tracked("schedules", 1))
#: Tables keyed by partition whose rows of the moving partitions are copied whole each round
#: (one row per partition or a few): the fences, and the legacy routes where they exist.
_REPLACED = ("partition_fences", "legacy_routes")


def home_partition(namespace: str, queue: str, partitions: int) -> int:
    """The partition whose shard holds a queue's ``queue_limits`` row (its token bucket):
    the queue's routing key, so the row follows that partition when it moves."""
    return key_partition(namespace, queue, partitions)


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

    async def put(self, data: bytes) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._error is not None
                or self._held == 0
                or self._held + len(data) <= self._limit
            )
            if self._error is not None:
                raise self._error
            self._chunks.append(bytes(data))
            self._held += len(data)
            self._changed.notify_all()

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
        self.index = index_name(move_id)
        # One literal for the index's predicate and every query over the moving rows: the
        # planner proves a partial index usable by matching the expression.
        self._moving = f"partition = ANY('{{{','.join(map(str, moving))}}}'::smallint[])"
        self.last_round: Round | None = None

    # -- phases ----------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Check both shards, mark the target's partitions incoming, build the move index."""
        raise NotImplementedError

    async def copy(self) -> int:
        """Copy every row of the moving partitions in one snapshot; returns the rows."""
        raise NotImplementedError

    async def catch_up(self) -> int:
        """One round: copy again what changed on the source since; returns rows changed."""
        raise NotImplementedError

    async def cut_over(self, next_version: int) -> CutOver:
        """Freeze the source, run the last round, make the target live since
        ``next_version``. The caller then commits map ``next_version`` in etcd."""
        raise NotImplementedError

    async def rollback(self) -> None:
        """Undo the move before its commit: the target holds nothing, the source is live."""
        raise NotImplementedError

    async def clean_up(self) -> int:
        """After the commit: delete the source's rows of the moved partitions; returns them."""
        raise NotImplementedError


_ = (Callable, time, asyncpg, home_partition)
