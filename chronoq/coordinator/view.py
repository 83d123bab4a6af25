"""A live local copy of one etcd prefix: an initial read, then a watch from revision + 1.

The watch resumes from the last revision seen after a broken stream (etcd restart, member
failover) so no event is missed, and resyncs with a fresh read when that revision was
compacted away. Callers get ``on_change()`` after each applied batch. Each stream is one pass
of a supervised loop: a broken stream is a failed pass, retried after ``retry_delay``.

aetcd multiplexes every watch of a client on one stream and matches a "created" answer to
the create request pending *now*: after a create timed out (a frozen etcd), its late answer
can be given to the next watch, of another prefix, and that watch's own answer to the one
after it. A view that receives a key outside its prefix therefore drops it, reads its prefix
again and watches anew. Two views can also swap streams, and the one handed a quiet
prefix's stream hears nothing at all: a view given ``verify_interval`` reads its prefix
after each such quiet interval, and when etcd holds changes that its stream has not
delivered by the next one, it takes the stream for another's and does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aetcd
import aetcd.exceptions

from chronoq.coordinator.etcd import translated
from chronoq.errors import CoordinatorUnavailable
from chronoq.supervision import Loop, Supervisor

log = logging.getLogger("chronoq.coordinator")


@dataclass(frozen=True)
class Entry:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


class PrefixView:
    """Keys under ``prefix`` with their values and revisions, kept current by a watch."""

    def __init__(
        self,
        client: aetcd.Client,
        prefix: bytes,
        on_change: Callable[[], None] = lambda: None,
        *,
        retry_delay: float = 0.2,
        supervisor: Supervisor | None = None,
        name: str | None = None,
        critical: bool = True,
        verify_interval: float | None = None,
    ) -> None:
        self._client = client
        self.prefix = prefix
        self._on_change = on_change
        self._retry_delay = retry_delay
        self._supervisor = supervisor or Supervisor()
        self.name = name or "watch-" + prefix.decode(errors="replace").rstrip("/").rsplit("/")[-1]
        self._critical = critical
        self.items: dict[bytes, Entry] = {}
        self.revision = 0
        self.resyncs = 0
        self.rewatches = 0
        self.crossed = 0  # streams that delivered another watch's keys
        self.missed = 0  # streams that were quiet while etcd changed under the prefix
        self._verify_interval = verify_interval
        self._suspect: int | None = None  # a revision the stream owes us since the last check
        self._stale = False  # read the prefix again before the next watch
        self._loop: Loop | None = None

    async def start(self) -> None:
        await self.resync()
        self.watch()

    def watch(self) -> None:
        """Follow the prefix from ``revision + 1`` in a supervised loop (until ``stop``)."""
        if self._loop is None:
            self._loop = self._supervisor.every(
                self.name,
                self.follow,
                interval=self._retry_delay,
                backoff=False,  # a rewatch is cheap, and a late one delays every handoff
                critical=self._critical,
            )

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None

    async def resync(self) -> None:
        with translated(f"read {self.prefix!r}"):
            result = await self._client.get_prefix(self.prefix)
        self.items = {
            kv.key: Entry(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)
            for kv in result
        }
        self.revision = result.header.revision
        self.resyncs += 1
        self._stale = False
        self._on_change()

    async def follow(self) -> None:
        """One watch stream, until it breaks; after a compaction, a fresh read instead."""
        if self._stale:
            await self.resync()
        compacted = False
        with translated(f"watch {self.prefix!r}"):
            try:
                await self._follow()
            except aetcd.exceptions.RevisionCompactedError:
                compacted = True
        if compacted:
            log.info("watch of %r: revision compacted, resyncing", self.prefix)
            await self.resync()

    async def _follow(self) -> None:
        watch = await self._client.watch_prefix(self.prefix, start_revision=self.revision + 1)
        self.rewatches += 1
        self._suspect = None
        if self._loop is not None:
            self._loop.ok()  # the stream is up: a burst of broken streams is over
        events: asyncio.Queue[Any] = asyncio.Queue(maxsize=1000)
        pump = asyncio.create_task(self._pump(watch, events))
        try:
            while True:
                try:
                    async with asyncio.timeout(self._verify_interval):
                        event = await events.get()
                except TimeoutError:
                    await self._verify()
                    continue
                if isinstance(event, BaseException):
                    raise event
                if event is None:
                    return
                self._apply(event)
        finally:
            pump.cancel()
            with contextlib.suppress(BaseException):
                await pump
            # Bounded: on a dead stream aetcd's cancel can wait forever for its request queue.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(watch.cancel()), 1.0)

    @staticmethod
    async def _pump(watch: Any, events: asyncio.Queue[Any]) -> None:
        """The stream's events into ``events``, then None at its end or the error it ended
        with: the follower can then wait for them with a timeout without hurting it."""
        try:
            async for event in watch:
                await events.put(event)
        except Exception as exc:  # noqa: BLE001 - handed to the follower, which raises it
            await events.put(exc)
        else:
            await events.put(None)

    def _apply(self, event: Any) -> None:
        kv = event.kv
        if not kv.key.startswith(self.prefix):
            self.crossed += 1
            self._stale = True
            raise CoordinatorUnavailable(
                f"etcd: the watch of {self.prefix!r} delivered {kv.key!r} (another "
                "watch's stream); reading the prefix again"
            )
        if event.kind == "DELETE":
            self.items.pop(kv.key, None)
        else:
            self.items[kv.key] = Entry(
                kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease
            )
        self.revision = max(self.revision, kv.mod_revision)
        self._on_change()

    async def _verify(self) -> None:
        """After a quiet interval: does etcd hold changes the stream has not delivered?

        The first sighting only notes the oldest revision owed (a watch may lag a little on
        a busy host); still owed at the next quiet interval, the stream is not ours.
        """
        if self._suspect is not None and self.revision < self._suspect:
            self.missed += 1
            self._stale = True
            raise CoordinatorUnavailable(
                f"etcd: the watch of {self.prefix!r} did not deliver revision "
                f"{self._suspect} in {self._verify_interval} s (another watch's stream); "
                "reading the prefix again"
            )
        self._suspect = None
        try:
            with translated(f"read {self.prefix!r}"):
                result = await self._client.get_prefix(self.prefix)
        except CoordinatorUnavailable:
            return  # a failed read says nothing of the stream: it goes on, checked next time
        if result.header.revision <= self.revision:
            return
        stored = {kv.key: kv.mod_revision for kv in result}
        owed = [
            m
            for k, m in stored.items()
            if m > self.revision and (k not in self.items or self.items[k].mod_revision != m)
        ]
        # A key gone from etcd was deleted after the revision the view is at.
        if self.items.keys() - stored.keys():
            owed.append(self.revision + 1)
        if owed:
            self._suspect = min(owed)
