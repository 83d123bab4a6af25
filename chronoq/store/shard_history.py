"""The store of shards' task history: the sweep shard after shard, slices on every shard
(``chronoq.store.history``, ``chronoq.store.sharded``).

A task's history row is on the shard of its partition, beside where the task was: reads by
id and keyed submits stay on one shard; listings fan out as for every state. Each shard
keeps its own slices (its own DDL, its own lock): a shard that is down keeps its rows and its
expired slices until it answers, and the others go on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from chronoq.errors import StoreUnavailable
from chronoq.store import fanout, legacy
from chronoq.store.history import Retired, SliceUpkeep
from chronoq.store.shard_routing import ShardRouting
from chronoq.store.store import Store


class ShardHistory(ShardRouting):
    """The sweep and the slice upkeep over the shards."""

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
        """Shard after shard, so that one call moves at most ``batch`` rows in all; the
        routes to tasks made before routing whose task is gone are dropped on the way, as by
        ``purge_finished`` (``chronoq.store.legacy``)."""
        await legacy.sweep(self._stores, self._routing().shard_of, partitions, self._route_sweeps)
        if (solo := self._fast()) is not None:
            return await solo.retire_finished(
                partitions, before, now, retention=retention, width=width, batch=batch
            )
        groups = fanout.grouped(list(partitions), self._routing().shard_of)
        left, total = batch, Retired()

        def sweep(mine: list[int], most: int) -> Callable[[Store], Awaitable[Retired]]:
            return lambda s: s.retire_finished(
                mine, before, now, retention=retention, width=width, batch=most
            )

        for shard, pos in groups.items():
            if left <= 0:
                break
            try:
                done = await self._on(shard, sweep([partitions[i] for i in pos], left))
            except StoreUnavailable as exc:  # the sweep waits for the shard
                self._skipped(shard, exc)
                continue
            total += done
            left -= done.gone
        return total

    async def keep_history(
        self, now: datetime, *, retention: timedelta | None, width: timedelta
    ) -> SliceUpkeep:
        """Every shard the map names, concurrently; a shard that is down is skipped."""
        done = await self._every(lambda s: s.keep_history(now, retention=retention, width=width))
        total = SliceUpkeep()
        for part in done.values():
            total += part
        return total
