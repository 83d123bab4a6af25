"""The etcd prefix view: resumes a broken watch without missing events, resyncs after
compaction (real etcd, its own member so the test can restart it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aetcd
import pytest

from chronoq.coordinator.etcd import EtcdSettings, connect
from chronoq.coordinator.view import PrefixView
from chronoq.embedded.etcd import EmbeddedEtcd

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    server = EmbeddedEtcd(tmp_path / "etcd", members=1, durable=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def until(predicate, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_watch_resumes_after_etcd_restart(own_etcd: EmbeddedEtcd) -> None:
    client = connect(EtcdSettings(endpoints=own_etcd.endpoints))
    writer = aetcd.Client(host="127.0.0.1", port=own_etcd.members[0].client_port, timeout=2)
    view = PrefixView(client, b"/p/", retry_delay=0.1)
    try:
        await writer.put(b"/p/a", b"1")
        await view.start()
        assert set(view.items) == {b"/p/a"}
        await asyncio.to_thread(own_etcd.stop_member, 0)
        await asyncio.sleep(0.5)  # the view notices the broken stream and keeps retrying
        await asyncio.to_thread(own_etcd.start_member, 0)
        await writer.close()
        writer = aetcd.Client(host="127.0.0.1", port=own_etcd.members[0].client_port, timeout=2)
        await writer.put(b"/p/b", b"2")
        await writer.delete(b"/p/a")
        await until(lambda: set(view.items) == {b"/p/b"})
        assert view.rewatches >= 2  # the stream broke and was re-established
        assert view.resyncs == 1  # resumed from revision + 1, no full re-read needed
    finally:
        await view.stop()
        await client.close()
        await writer.close()


async def test_compacted_revision_forces_a_resync(own_etcd: EmbeddedEtcd) -> None:
    client = connect(EtcdSettings(endpoints=own_etcd.endpoints))
    changes: list[int] = []
    view = PrefixView(client, b"/c/", lambda: changes.append(1), retry_delay=0.1)
    try:
        await client.put(b"/c/x", b"1")
        await view.resync()
        stale = view.revision
        for i in range(5):
            await client.put(b"/c/y", str(i).encode())
        head = (await client.get(b"/c/y")).mod_revision  # type: ignore[union-attr]
        await client.compact(head)
        view.revision = stale  # as if the watch had been down since `stale`
        view._task = asyncio.create_task(view._run())  # follow from the stale revision
        await until(lambda: view.resyncs >= 2 and view.items.get(b"/c/y") is not None)
        assert view.items[b"/c/y"].value == b"4"
        assert view.revision >= head
    finally:
        await view.stop()
        await client.close()
