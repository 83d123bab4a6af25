"""The store of shards' queue settings: every setting written to every shard, read from the
map's first shard (``chronoq.store.sharded``).

Each shard's claim statement reads its own copy of a queue's settings, and its hand-off
statements refuse a gated queue by that copy, so a setting goes to every shard the map
names (holding partitions or not: an empty shard receives them by a move): the first shard
(``shard-0``, never removed) first, where the namespace's cap is counted, then the others
at once. A shard that cannot be written fails the call (UNAVAILABLE) after the others took
the setting; every call here is safe to repeat, and repeating it brings the shards level.
A resume runs its misfire pass on every shard before the pause ends on any of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeVar

from chronoq.queue_settings import QueueSettings, Resumed
from chronoq.store.shard_routing import ShardRouting
from chronoq.store.store import Store

R = TypeVar("R")


class ShardQueues(ShardRouting):
    """Queue settings over the shards."""

    async def _everywhere(self, call: Callable[[Store], Awaitable[R]]) -> R:
        """``call`` on the first shard, then on every other one concurrently (none skipped);
        the first shard's answer."""
        first = await self._on(self._limits_shard, call)
        others = [n for n in self._routing().shards[1:] if n in self._stores]
        if others:
            await self._every_of(others, call)
        return first

    async def _every_of(self, names: list[str], call: Callable[[Store], Awaitable[R]]) -> None:
        answers = await asyncio.gather(*(self._on(n, call) for n in names), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer

    async def set_queue(
        self,
        namespace: str,
        queue: str,
        now: datetime,
        *,
        max_running_per_key: int | None = None,
        max_starts_per_key: float | None = None,
        cap: int,
    ) -> QueueSettings:
        return await self._everywhere(
            lambda s: s.set_queue(
                namespace,
                queue,
                now,
                max_running_per_key=max_running_per_key,
                max_starts_per_key=max_starts_per_key,
                cap=cap,
            )
        )

    async def pause_queue(
        self, namespace: str, queue: str, now: datetime, *, cap: int
    ) -> QueueSettings:
        return await self._everywhere(lambda s: s.pause_queue(namespace, queue, now, cap=cap))

    async def resume_queue(self, namespace: str, queue: str, now: datetime) -> Resumed:
        skipped = await self._every(
            lambda s: s.skip_overdue_ready(namespace, queue, now), skip_down=False
        )
        settings = await self._everywhere(lambda s: s.unpause_queue(namespace, queue, now))
        ready = await self._every(lambda s: s.ready_count(namespace, queue))
        return Resumed(settings, sum(skipped.values()), sum(ready.values()))

    async def queue_settings(self, namespace: str, queue: str) -> QueueSettings:
        return await self._on(self._limits_shard, lambda s: s.queue_settings(namespace, queue))

    async def list_queue_settings(self, namespace: str, *, limit: int) -> list[QueueSettings]:
        return await self._on(
            self._limits_shard, lambda s: s.list_queue_settings(namespace, limit=limit)
        )

    async def gated_queues(self) -> list[QueueSettings]:
        return await self._on(self._limits_shard, lambda s: s.gated_queues())
