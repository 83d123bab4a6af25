"""The store of shards' notices (announced on one shard, listened to on every one),
reachability and server clocks (``chronoq.store.sharded``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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

    async def probe_any(self, timeout: float = 2.0) -> bool:
        """Whether any shard answers within ``timeout``: a node that reaches one is not cut
        off from the store (a shard down, or out of this node's reach, is the shard watch's
        to handle). The first answer decides; a probe still unanswered then (on a cut link
        it may hang past its own timeout) is left to end and is waited on again by the next
        call instead of a new one, so a dead shard holds one probe at most."""
        if (solo := self._fast()) is not None:
            return await solo.probe(timeout)
        for name, store in self._stores.items():
            running = self._any_probes.get(name)
            if running is None or running.done():
                task = asyncio.ensure_future(store.probe(timeout))
                task.add_done_callback(_seen)
                self._any_probes[name] = task
        waiting: set[asyncio.Future[bool]] = set(self._any_probes.values())
        deadline = asyncio.get_running_loop().time() + timeout
        while waiting:
            left = deadline - asyncio.get_running_loop().time()
            done, waiting = await asyncio.wait(
                waiting, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                return False
            if any(not t.cancelled() and t.exception() is None and t.result() for t in done):
                return True
        return False

    async def probe_shard(self, name: str, timeout: float = 2.0) -> bool:
        """Whether shard ``name`` answers within ``timeout`` seconds (False: no store)."""
        store = self._stores.get(name)
        return store is not None and await store.probe(timeout)

    @contextlib.asynccontextmanager
    async def server_clock(self) -> AsyncIterator[Callable[[], Awaitable[datetime]]]:
        """The clock of the map's first shard that answers (``server_clock_of``: a given
        shard's). The first shard is every node's reference while it answers; while it is
        down (or failing, ``_failing``) the next one stands in, so one shard's outage does not
        fail every node's clock check, and with it their health. The shards' servers keep one
        time (NTP), as the nodes must."""
        names = list(self._routing().shards)
        failing = {n for n in names if self._failing(n)}
        order = [n for n in names if n not in failing] + [n for n in names if n in failing]
        last: ShardUnavailable | None = None
        async with contextlib.AsyncExitStack() as stack:
            read: Callable[[], Awaitable[datetime]] | None = None
            for name in order:
                if name not in self._stores:
                    continue
                try:
                    read = await stack.enter_async_context(self.server_clock_of(name))
                except ShardUnavailable as exc:
                    last = exc
                    continue
                break
            if read is None:
                raise last if last is not None else ShardUnavailable(names[0], "no connection")
            yield read

    @contextlib.asynccontextmanager
    async def server_clock_of(self, name: str) -> AsyncIterator[Callable[[], Awaitable[datetime]]]:
        store = self._store(name)
        try:
            async with store.server_clock() as read:
                yield read
        except ShardUnavailable:
            raise
        except StoreUnavailable as exc:
            self._failed(name)
            raise ShardUnavailable(name, exc.message) from exc

    async def close(self) -> None:
        for task in self._any_probes.values():
            task.cancel()
        for probe in self._failures.values():
            if probe is not None:
                probe.cancel()
        await asyncio.gather(*(s.close() for s in self._stores.values()), return_exceptions=True)


def _seen(task: asyncio.Task[bool]) -> None:
    if not task.cancelled():
        task.exception()  # a probe that failed answered no: nothing to log
