"""The fence audit over two real shards while one shard's link is slow and resets
connections (the chaos proxy's shaped link): the read over both shards skips the lossy one,
and the audit must not take that silence for a fence the store lost."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import asyncpg
import pytest

from chronoq.chaos.proxy import ProxyHub
from chronoq.chaos.shaping import LinkShape
from chronoq.coordinator.fence_audit import audit_fences
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.store.rows import Fence
from tests.contract.conftest import PARTITIONS, TWO_SHARDS, open_two
from tests.integration.conftest import through

pytestmark = pytest.mark.timeout(60)

TOKEN = 7
#: Slow and lossy: every connection is reset within milliseconds of being opened.
LOSSY = LinkShape(latency_s=0.03, jitter_s=0.02, mean_life_s=0.005)


async def test_the_audit_skips_a_slow_shard_instead_of_taking_its_fences_again(
    two_dsns: tuple[str, str],
    postgres: EmbeddedPostgres,
    hub: ProxyHub,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tcp = urlsplit(postgres.over_tcp(two_dsns[1]))
    link = hub.add(f"{tcp.hostname}:{tcp.port}", "shard-1")
    async with open_two((two_dsns[0], through(tcp.geturl(), link))) as sharded:
        owned = dict.fromkeys(range(PARTITIONS), TOKEN)
        for p in owned:
            assert await sharded.take_fence(p, TOKEN, "c1", "n0") is not None
        on_0 = set(TWO_SHARDS.held_by("shard-0"))
        went_back = min(on_0)  # shard-0 lost our last commit for this one (a failover)
        conn = await asyncpg.connect(two_dsns[0], timeout=5)
        try:
            await conn.execute(
                "UPDATE partition_fences SET token = $2 WHERE partition = $1",
                went_back, TOKEN - 1,
            )  # fmt: skip
        finally:
            await conn.close()

        link.shape(LOSSY, seed=1)
        await asyncio.sleep(0.2)  # the proxy's loop applies it to the open connections
        # What the audit used to judge by: shard-1's fences are simply absent from the read
        # over both shards, exactly as if that store had lost them.
        assert {f.partition for f in await sharded.fences()} == on_0
        # Told apart: a shard that did not answer leaves its partitions out.
        assert set(await sharded.fences_of(sorted(owned))) == on_0

        with caplog.at_level(logging.WARNING, logger="chronoq.coordinator"):
            assert await audit_fences(sharded, owned, "c1", "n0") == {went_back}
        lost = [r.getMessage() for r in caplog.records if "lost this owner's fence" in r.message]
        assert len(lost) == 1 and lost[0].startswith(f"partition {went_back}:")

        link.unshape()
        await asyncio.sleep(0.2)

        async def answered() -> dict[int, Fence | None]:
            for _ in range(50):  # the pool replaces the connections the link reset
                read = await sharded.fences_of(sorted(owned))
                if len(read) == PARTITIONS:
                    return dict(read)
                await asyncio.sleep(0.1)
            raise AssertionError("shard-1 never answered again")

        read = await answered()
        assert all(f is not None and f.token == TOKEN for f in read.values())
        assert await audit_fences(sharded, owned, "c1", "n0") == set()  # nothing to fix
