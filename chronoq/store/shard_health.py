"""The store of shards' notices (announced on one shard, listened to on every one),
reachability and server clocks (``chronoq.store.sharded``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime

from chronoq.errors import ShardUnavailable, StoreUnavailable
from chronoq.store.connection import Listener
from chronoq.store.shard_routing import ShardRouting


class _Listenings:
    """Listening on every shard: closed as soon as one of them is lost (or was not opened),
    so the caller opens all again."""

    def __init__(self, parts: Sequence[Listener], complete: bool) -> None:
        self._parts = parts
        self._complete = complete

    @property
    def closed(self) -> bool:
        return not self._complete or any(p.closed for p in self._parts)

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self._parts), return_exceptions=True)
        self._complete = False


class ShardHealth(ShardRouting):
    """Notices, probes, clocks and closing, per shard or over all of them."""

    async def announce(self, channel: str, payloads: Sequence[str]) -> None:
        """On the first shard that answers: every node listens on every shard."""
        if (solo := self._fast()) is not None:
            return await solo.announce(channel, payloads)
        if not payloads:
            return
        last: StoreUnavailable | None = None
        for name in self._routing().shards:
            if name not in self._stores:
                continue
            try:
                return await self._on(name, lambda s: s.announce(channel, payloads))
            except StoreUnavailable as exc:
                last = exc
        if last is not None:
            raise last

    async def listen(
        self, channel: str, on_notice: Callable[[str], None]
    ) -> Listener | _Listenings:
        """On every shard; the listening is closed (to be opened again) once one is lost,
        or at once when a shard could not be reached."""
        if (solo := self._fast()) is not None:
            return await solo.listen(channel, on_notice)
        opened = await self._every(lambda s: s.listen(channel, on_notice))
        return _Listenings(list(opened.values()), complete=len(opened) == len(self._stores))

    async def probe(self, timeout: float = 2.0) -> bool:
        """Whether every shard answers (``probe_shard``: one)."""
        answers = await asyncio.gather(*(s.probe(timeout) for s in self._stores.values()))
        return all(answers)

    async def probe_shard(self, name: str, timeout: float = 2.0) -> bool:
        """Whether shard ``name`` answers within ``timeout`` seconds (False: no store)."""
        store = self._stores.get(name)
        return store is not None and await store.probe(timeout)

    def server_clock(self) -> AbstractAsyncContextManager[Callable[[], Awaitable[datetime]]]:
        """The first shard's server clock (``server_clock_of``: any shard's)."""
        return self.server_clock_of(self._routing().shards[0])

    @contextlib.asynccontextmanager
    async def server_clock_of(self, name: str) -> AsyncIterator[Callable[[], Awaitable[datetime]]]:
        store = self._store(name)
        try:
            async with store.server_clock() as read:
                yield read
        except ShardUnavailable:
            raise
        except StoreUnavailable as exc:
            raise ShardUnavailable(name, exc.message) from exc

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._stores.values()), return_exceptions=True)
