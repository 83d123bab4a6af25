"""The etcd prefix view: resumes a broken watch without missing events, resyncs after
compaction (real etcd, its own member so the test can restart it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from chronoq.coordinator.etcd import connect
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


async def test_watch_resumes_from_its_revision_after_losing_its_member(tmp_path: Path) -> None:
    """The view talks to member 0 only; writes land through member 1 while member 0 is down.
    When member 0 is back, the view must replay exactly those changes (watch from rev + 1)."""
    server = EmbeddedEtcd(tmp_path / "etcd3", members=3, durable=True)
    server.start()
    client = connect(replace(server.client_settings(), endpoints=[server.endpoints[0]]))
    writer = connect(replace(server.client_settings(), endpoints=[server.endpoints[1]]))
    view = PrefixView(client, b"/chronoq/p/", retry_delay=0.1)
    try:
        await writer.put(b"/chronoq/p/a", b"1")
        await view.start()
        assert set(view.items) == {b"/chronoq/p/a"}
        await asyncio.to_thread(server.stop_member, 0)
        for i in range(3):
            await writer.put(b"/chronoq/p/b", str(i).encode())  # missed by the view while it is down
        await writer.delete(b"/chronoq/p/a")
        await asyncio.sleep(0.3)
        assert set(view.items) == {b"/chronoq/p/a"}
        await asyncio.to_thread(server.start_member, 0)
        await until(lambda: set(view.items) == {b"/chronoq/p/b"})
        assert view.items[b"/chronoq/p/b"].value == b"2"
        assert view.resyncs == 1  # resumed from revision + 1: no full re-read was needed
    finally:
        await view.stop()
        await client.close()
        await writer.close()
        server.stop()


async def test_compacted_revision_forces_a_resync(own_etcd: EmbeddedEtcd) -> None:
    client = connect(own_etcd.client_settings())
    changes: list[int] = []
    view = PrefixView(client, b"/chronoq/c/", lambda: changes.append(1), retry_delay=0.1)
    try:
        await client.put(b"/chronoq/c/x", b"1")
        await view.resync()
        stale = view.revision
        for i in range(5):
            await client.put(b"/chronoq/c/y", str(i).encode())
        head = (await client.get(b"/chronoq/c/y")).mod_revision  # type: ignore[union-attr]
        await client.compact(head)
        view.revision = stale  # as if the watch had been down since `stale`
        view.watch()  # follow from the stale revision
        await until(lambda: view.resyncs >= 2 and view.items.get(b"/chronoq/c/y") is not None)
        assert view.items[b"/chronoq/c/y"].value == b"4"
        assert view.revision >= head
    finally:
        await view.stop()
        await client.close()
