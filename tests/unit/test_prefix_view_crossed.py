"""A watch stream that delivers another prefix's keys (aetcd can hand a late "created" answer
to the wrong watch) is dropped: the view reads its prefix again instead of parsing garbage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from chronoq.coordinator.view import PrefixView
from chronoq.supervision import LoopPolicy, Supervisor


@dataclass
class KV:
    key: bytes
    value: bytes = b"v"
    create_revision: int = 1
    mod_revision: int = 1
    lease: int = 0


@dataclass
class Event:
    kv: KV
    kind: str = "PUT"


@dataclass
class Header:
    revision: int


class Result(list[KV]):
    def __init__(self, kvs: list[KV], revision: int) -> None:
        super().__init__(kvs)
        self.header = Header(revision)


@dataclass
class FakeWatch:
    events: list[Event]
    cancelled: bool = False

    async def _iterate(self) -> AsyncIterator[Event]:
        for event in self.events:
            yield event
        await asyncio.Event().wait()  # then an idle, healthy stream

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeClient:
    """The etcd calls a view makes: a read of the prefix, then watches (scripted)."""

    stored: list[KV]
    watches: list[FakeWatch] = field(default_factory=list)
    reads: int = 0

    async def get_prefix(self, prefix: bytes) -> Result:
        self.reads += 1
        return Result(list(self.stored), revision=10 + self.reads)

    async def watch_prefix(self, prefix: bytes, start_revision: int) -> FakeWatch:
        return self.watches.pop(0)


async def test_a_crossed_stream_is_dropped_and_the_prefix_read_again() -> None:
    owners = b"/chronoq/c/owners/"
    crossed = FakeWatch([Event(KV(b"/chronoq/c/members/n1", mod_revision=12))])
    good = FakeWatch([Event(KV(owners + b"00003", b"n2", mod_revision=13))])
    client: Any = FakeClient([KV(owners + b"00001", b"n1")], [crossed, good])
    sup = Supervisor(LoopPolicy(max_backoff=0.01))
    view = PrefixView(client, owners, retry_delay=0.001, supervisor=sup)
    try:
        await view.start()
        deadline = time.monotonic() + 5
        while owners + b"00003" not in view.items:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        assert set(view.items) == {owners + b"00001", owners + b"00003"}  # no members key
        assert view.crossed == 1 and crossed.cancelled
        assert view.resyncs == 2  # the start, then again after the crossed stream
        (loop,) = sup.loops
        assert loop.name == "watch-owners" and loop.failures == 1 and loop.failing == 0
    finally:
        await sup.stop()


async def test_a_quiet_stream_that_misses_the_prefix_changes_is_dropped() -> None:
    """Two views can swap streams: the one handed a quiet prefix's stream hears nothing and
    sees no foreign key. It checks etcd after quiet intervals and reads its prefix again."""
    owners = b"/chronoq/c/owners/"
    quiet = FakeWatch([])  # another watch's stream, of a prefix where nothing happens
    good = FakeWatch([])
    client: Any = FakeClient([KV(owners + b"00001", b"n1")], [quiet, good])
    sup = Supervisor(LoopPolicy(max_backoff=0.01))
    view = PrefixView(client, owners, retry_delay=0.001, supervisor=sup, verify_interval=0.05)
    try:
        await view.start()
        client.stored = [KV(owners + b"00003", b"n2", mod_revision=30)]  # 00001 deleted
        deadline = time.monotonic() + 5
        while set(view.items) != {owners + b"00003"}:
            assert time.monotonic() < deadline, "the view sat on a stream that is not its own"
            await asyncio.sleep(0.005)
        assert view.missed == 1 and quiet.cancelled and view.rewatches == 2
    finally:
        await sup.stop()


async def test_a_quiet_prefix_alone_is_no_reason_to_read_it_again() -> None:
    owners = b"/chronoq/c/owners/"
    client: Any = FakeClient([KV(owners + b"00001", b"n1")], [FakeWatch([])])
    sup = Supervisor(LoopPolicy(max_backoff=0.01))
    view = PrefixView(client, owners, retry_delay=0.001, supervisor=sup, verify_interval=0.02)
    try:
        await view.start()
        await asyncio.sleep(0.3)  # many quiet intervals, etcd unchanged
        assert view.missed == 0 and view.resyncs == 1 and view.rewatches == 1
        assert client.reads > 3  # it did check
    finally:
        await sup.stop()


async def test_a_failed_check_leaves_a_healthy_stream_alone() -> None:
    owners = b"/chronoq/c/owners/"

    class Failing(FakeClient):
        async def get_prefix(self, prefix: bytes) -> Result:
            if self.reads >= 1:
                raise OSError("etcd unreachable")  # aetcd's errors arrive translated
            return await super().get_prefix(prefix)

    client: Any = Failing([KV(owners + b"00001", b"n1")], [FakeWatch([])])
    sup = Supervisor(LoopPolicy(max_backoff=0.01))
    view = PrefixView(client, owners, retry_delay=0.001, supervisor=sup, verify_interval=0.02)
    try:
        await view.start()
        await asyncio.sleep(0.2)
        assert view.rewatches == 1 and view.missed == 0
        (loop,) = sup.loops
        assert loop.failures == 0
    finally:
        await sup.stop()
