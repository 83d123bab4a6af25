"""Two nodes of a cluster whose PostgreSQL links turn slow and lossy (the chaos proxy's
shaped link, as the ``slow-links-postgres`` fault makes them): the store answers, slowly, so
neither node steps out of the ring and no partition changes hands; a node whose link is cut
still steps out. Real PostgreSQL, real etcd."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from chronoq.chaos.proxy import Blackhole, ProxyHub
from chronoq.chaos.shaping import LinkShape
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.node import Node
from tests.integration.conftest import NodeFactory, through
from tests.integration.test_cluster_inproc import cluster, settled

pytestmark = pytest.mark.timeout(90)

#: The chaos fault's links (30 ± 20 ms each way, 512 KiB/s, a reset every 8 s on average).
SLOW = LinkShape()
HOLD_S = 12.0


async def two_nodes(
    make_node: NodeFactory, etcd: Any, cluster_name: str, dsn: str,
    postgres: EmbeddedPostgres, hub: ProxyHub,
) -> tuple[list[Node], list[Blackhole]]:  # fmt: skip
    tcp = urlsplit(postgres.over_tcp(dsn))
    links = [hub.add(f"{tcp.hostname}:{tcp.port}", f"pg-{i}") for i in range(2)]
    nodes = [
        await make_node(
            cluster=cluster(etcd, cluster_name),
            node_id=f"s{i}",
            dsn=through(tcp.geturl(), link),
            store_grace=timedelta(seconds=1.2),
        )
        for i, link in enumerate(links)
    ]
    await settled(nodes)
    return nodes, links


async def test_slow_links_to_the_store_move_no_partition(
    make_node: NodeFactory, etcd: Any, cluster_name: str, dsn: str,
    postgres: EmbeddedPostgres, hub: ProxyHub,
) -> None:  # fmt: skip
    nodes, links = await two_nodes(make_node, etcd, cluster_name, dsn, postgres, hub)
    before = await settled(nodes)
    for i, link in enumerate(links):
        link.shape(SLOW, seed=i)
    changes = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + HOLD_S
    try:
        while loop.time() < end:
            for n in nodes:
                assert n.ownership is not None
                changes += any(before[p] != n.settings.node_id for p in n.ownership.owned())
                changes += any(
                    p not in n.ownership.owned()
                    for p, who in before.items()
                    if who == n.settings.node_id
                )
            await asyncio.sleep(0.05)
    finally:
        for link in links:
            link.unshape()
    watches = [n.store_watch for n in nodes]
    assert all(w is not None for w in watches)
    print(  # what the slow links did (pytest -s)
        "resets", [link.resets for link in links],
        "probes", [getattr(w, "probes", None) for w in watches],
        "answered", [getattr(w, "slow", None) for w in watches],
        "shard watch out", [n.shard_watch.suspensions for n in nodes if n.shard_watch],
    )  # fmt: skip
    # Firing outlasted a quarter of the grace on the slow link, and the store answered the
    # watch's own probe there: slow, not out of reach.
    assert all(w is not None and w.slow > 0 for w in watches)
    assert [w.suspensions for w in watches if w is not None] == [0, 0]
    assert changes == 0, "a partition changed hands while the store answered, slowly"
    assert await settled(nodes) == before


async def test_a_node_whose_link_is_cut_still_steps_out(
    make_node: NodeFactory, etcd: Any, cluster_name: str, dsn: str,
    postgres: EmbeddedPostgres, hub: ProxyHub,
) -> None:  # fmt: skip
    nodes, links = await two_nodes(make_node, etcd, cluster_name, dsn, postgres, hub)
    links[0].cut()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        own = nodes[0].ownership
        assert own is not None
        # Stepped out (by the store watch or the shard watch, whichever first) and done
        # releasing: ``suspended`` turns true before the release, and until the others see
        # the member key gone their assignment still counts the node in.
        while not own.suspended or own.owned():
            assert loop.time() < deadline, "the cut-off node kept its partitions"
            await asyncio.sleep(0.05)
        owners = await settled(nodes)
        assert set(owners.values()) == {"s1"}
    finally:
        links[0].heal()
