"""The store watch over two real shards: one shard out of reach is that shard's outage (its
own watch holds its partitions), not a node cut off from the store; both out of reach is."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import pytest

from chronoq.chaos.proxy import ProxyHub
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.node.housekeeping import StoreWatch
from tests.contract.conftest import open_two
from tests.integration.conftest import through

pytestmark = pytest.mark.timeout(60)

GRACE = 1.0
WATCHED_S = 3.0


class Ownership:
    """What the watch does with the partitions, recorded (no etcd needed to decide it)."""

    def __init__(self) -> None:
        self.suspended = False
        self.suspensions = 0

    async def suspend(self) -> None:
        self.suspended = True
        self.suspensions += 1

    async def resume(self) -> None:
        self.suspended = False


async def watched(watch: StoreWatch, own: Ownership, seconds: float) -> None:
    """Run the watch's checks as its loop would, for ``seconds`` or until it steps out."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not own.suspended:
        await watch.check()
        await asyncio.sleep(GRACE / 5)


async def test_a_node_that_reaches_one_shard_of_two_stays_in(
    two_dsns: tuple[str, str], postgres: EmbeddedPostgres, hub: ProxyHub
) -> None:
    tcp = urlsplit(postgres.over_tcp(two_dsns[1]))
    link = hub.add(f"{tcp.hostname}:{tcp.port}", "shard-1")
    async with open_two((two_dsns[0], through(tcp.geturl(), link))) as sharded:
        link.cut()
        own = Ownership()
        # Firing has not reached the store since the cut: each tick over both shards fails.
        since = time.monotonic()
        watch = StoreWatch(sharded, own, lambda: since, grace=GRACE)  # type: ignore[arg-type]
        try:
            await watched(watch, own, WATCHED_S)
        finally:
            watch.close()
            link.heal()
        assert own.suspensions == 0, "a node that reaches shard-0 left the ring for shard-1"
        assert watch.slow > 0  # it asked, and shard-0 answered


async def test_a_node_that_reaches_no_shard_steps_out(
    two_dsns: tuple[str, str], postgres: EmbeddedPostgres, hub: ProxyHub
) -> None:
    tcps = [urlsplit(postgres.over_tcp(dsn)) for dsn in two_dsns]
    links = [hub.add(f"{t.hostname}:{t.port}", f"shard-{i}") for i, t in enumerate(tcps)]
    dsns = (through(tcps[0].geturl(), links[0]), through(tcps[1].geturl(), links[1]))
    async with open_two(dsns) as sharded:
        for link in links:
            link.cut()
        own = Ownership()
        since = time.monotonic()
        watch = StoreWatch(sharded, own, lambda: since, grace=GRACE)  # type: ignore[arg-type]
        try:
            await watched(watch, own, WATCHED_S)
        finally:
            watch.close()
            for link in links:
                link.heal()
        assert own.suspensions == 1
