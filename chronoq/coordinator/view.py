"""A live local copy of one etcd prefix: an initial read, then a watch from revision + 1.

The watch resumes from the last revision seen after a broken stream (etcd restart, member
failover) so no event is missed, and resyncs with a fresh read when that revision was
compacted away. Callers get ``on_change()`` after each applied batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aetcd
import aetcd.exceptions

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
    ) -> None:
        self._client = client
        self.prefix = prefix
        self._on_change = on_change
        self._retry_delay = retry_delay
        self.items: dict[bytes, Entry] = {}
        self.revision = 0
        self.resyncs = 0
        self.rewatches = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.resync()
        self._task = asyncio.create_task(self._run(), name=f"watch {self.prefix!r}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, 3.0)
            self._task = None

    async def resync(self) -> None:
        result = await self._client.get_prefix(self.prefix)
        self.items = {
            kv.key: Entry(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)
            for kv in result
        }
        self.revision = result.header.revision
        self.resyncs += 1
        self._on_change()

    async def _run(self) -> None:
        while True:
            try:
                await self._follow()
            except aetcd.exceptions.RevisionCompactedError:
                log.info("watch of %r: revision compacted, resyncing", self.prefix)
                await self._retry(self.resync)
                continue
            except Exception as exc:  # noqa: BLE001 - any broken stream: resume, never die
                log.info(
                    "watch of %r broke (%s); resuming from %d", self.prefix, exc, self.revision + 1
                )
            await asyncio.sleep(self._retry_delay)

    async def _follow(self) -> None:
        watch = await self._client.watch_prefix(self.prefix, start_revision=self.revision + 1)
        self.rewatches += 1
        try:
            async for event in watch:
                kv = event.kv
                if event.kind == "DELETE":
                    self.items.pop(kv.key, None)
                else:
                    self.items[kv.key] = Entry(
                        kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease
                    )
                self.revision = max(self.revision, kv.mod_revision)
                self._on_change()
        finally:
            # Bounded: on a dead stream aetcd's cancel can wait forever for its request queue.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(watch.cancel()), 1.0)

    async def _retry(self, step: Callable[[], object]) -> None:
        while True:
            try:
                await step()  # type: ignore[misc]
                return
            except (aetcd.exceptions.ClientError, OSError, TimeoutError) as exc:
                log.info("etcd read of %r failed (%s); retrying", self.prefix, exc)
                await asyncio.sleep(self._retry_delay)
