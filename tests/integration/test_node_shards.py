"""A node on two store shards: two real PostgreSQL servers (the session's, and one of the
test's own that it stops), real etcd. Submits land in the shard of their partition, both
shards fire, Status shows both; one shard down stops only its partitions."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import uuid
import warnings
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoq.client import Client
from chronoq.coordinator.etcd import Keys, connect
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import ChronoqError
from chronoq.models import TaskState
from chronoq.node import Node
from chronoq.node.node import STORE_HEALTH_PREFIX
from chronoq.routing import key_partition
from chronoq.shardmap import ShardMap, even
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster, settled

pytestmark = pytest.mark.timeout(120)

P = 16  # even(16, 2): shard-0 holds 0-7, shard-1 holds 8-15


def keys_on(shard: str, count: int, prefix: str) -> list[str]:
    """Idempotency keys whose partition the two-shard map places on ``shard``."""
    m = even(P, 2)
    out: list[str] = []
    i = 0
    while len(out) < count:
        key = f"{prefix}-{i}"
        if m.shard_of(key_partition("default", key, P)) == shard:
            out.append(key)
        i += 1
    return out


async def seen_down(node: Node, shard: str) -> None:
    """Until ``node``'s shard watch holds ``shard`` for down."""

    async def down() -> bool:
        assert node.shard_watch is not None
        return shard in node.shard_watch.down

    await until(down, what=f"{shard} seen down")


async def until(check: Any, timeout: float = 30, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, f"{what} not reached in {timeout} s"
        await asyncio.sleep(0.1)


async def count_rows(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        rows = await conn.fetch(
            "SELECT state, count(*) AS n FROM tasks_with_history GROUP BY state"
        )
    finally:
        await conn.close()
    return {str(r["state"]): r["n"] for r in rows}


@pytest.fixture
async def second(pg: EmbeddedPostgres) -> AsyncIterator[str]:
    """shard-1's database, on a server of the test's own (migrated by the node)."""
    yield pg.create_database(f"s1_{uuid.uuid4().hex[:8]}")


async def serving(address: str, service: str) -> int:
    import grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


async def test_a_node_on_two_shards_places_fires_and_shows_both(
    make_node: NodeFactory, etcd: Any, cluster_name: str, dsn: str, second: str
) -> None:
    node = await make_node(
        cluster=cluster(etcd, cluster_name), node_id="n0", store_shards=(second,)
    )
    await settled([node])
    etcd_client = connect(etcd.client_settings(cluster_name))
    try:
        stored = await etcd_client.get(Keys(cluster_name).shard_map)
        assert stored is not None
        assert ShardMap.from_json(stored.value) == even(P, 2)
        registered = await etcd_client.get(Keys(cluster_name).shard_dsn("shard-1"))
        assert registered is not None
        assert "***" in registered.value.decode() or "@" not in registered.value.decode()
    finally:
        await etcd_client.close()
    client = Client(node.address)
    try:
        now = datetime.now(UTC)
        first = keys_on("shard-0", 5, "a")
        other = keys_on("shard-1", 5, "b")
        for key in [*first, *other]:
            await client.submit("q", idempotency_key=key, run_at=now)
        assert sum((await count_rows(dsn)).values()) == 5
        assert sum((await count_rows(second)).values()) == 5

        async def fired() -> bool:
            a, b = await count_rows(dsn), await count_rows(second)
            return a.get("scheduled", 0) == 0 and b.get("scheduled", 0) == 0

        await until(fired, what="both shards fired")
        status = await client.status()
        assert status.shard_map is not None
        shards = {s.name: s for s in status.shard_map.shards}
        assert set(shards) == {"shard-0", "shard-1"}
        assert shards["shard-0"].health == shards["shard-1"].health == "ok"
        assert (shards["shard-0"].partitions, shards["shard-1"].partitions) == ("0-7", "8-15")
        assert {o.partition: o.shard for o in status.ownership} == {
            p: ("shard-0" if p < 8 else "shard-1") for p in range(P)
        }
        assert node.ownership is not None
        stats = node.published_stats()
        assert stats["map_version"] == 1.0
    finally:
        await client.close()


async def test_one_shard_down_stops_only_its_partitions(
    make_node: NodeFactory,
    etcd: Any,
    cluster_name: str,
    dsn: str,
    second: str,
    pg: EmbeddedPostgres,
) -> None:
    node = await make_node(
        cluster=cluster(etcd, cluster_name), node_id="n0", store_shards=(second,)
    )
    await settled([node])
    client = Client(node.address, timeout=3)
    try:
        later = datetime.now(UTC) + timedelta(seconds=4)
        # Due while shard-1 is down: they must fire once it is back, once.
        waiting = keys_on("shard-1", 4, "w")
        for key in waiting:
            await client.submit("q", idempotency_key=key, run_at=later)
        pg.stop()
        await seen_down(node, "shard-1")
        assert await serving(node.address, f"{STORE_HEALTH_PREFIX}shard-1") == (
            health_pb2.HealthCheckResponse.NOT_SERVING
        )
        assert await serving(node.address, "") == health_pb2.HealthCheckResponse.SERVING
        assert node.ownership is not None
        assert not set(node.ownership.owned()) & set(range(8, 16))
        assert set(node.ownership.owned()) == set(range(8))
        # shard-0's partitions still accept submits and fire.
        now = datetime.now(UTC)
        alive = keys_on("shard-0", 5, "alive")
        for key in alive:
            await client.submit("q", idempotency_key=key, run_at=now)

        async def alive_fired() -> bool:
            return (await count_rows(dsn)).get("scheduled", 0) == 0

        await until(alive_fired, what="shard-0 fired while shard-1 is down")
        with pytest.raises(ChronoqError):
            await client.submit("q", idempotency_key=keys_on("shard-1", 1, "refused")[0])
        status = await client.status()
        assert status.shard_map is not None
        health = {s.name: s.health for s in status.shard_map.shards}
        assert health == {"shard-0": "ok", "shard-1": "down"}
        await asyncio.sleep(4)  # the waiting tasks come due while their shard is down
        pg.start()

        async def back() -> bool:
            assert node.shard_watch is not None
            return not node.shard_watch.down

        await until(back, what="shard-1 back")

        async def late_fired() -> bool:
            return (await count_rows(second)).get("scheduled", 0) == 0

        await until(late_fired, what="shard-1's due tasks fired after it came back")
        assert await serving(node.address, f"{STORE_HEALTH_PREFIX}shard-1") == (
            health_pb2.HealthCheckResponse.SERVING
        )
        # Nothing lost, nothing fired twice: each task ready once, at its first attempt.
        assert node.store is not None
        store = node.store
        claimed: list[Any] = []

        async def all_claimed() -> bool:
            # A claim over several shards skips one that fails, as the restarted shard's
            # pooled connections do once before the pool replaces them: claim until every
            # task came, then check each came once.
            claimed.extend(await store.claim("default", ["q"], "w", 1000, datetime.now(UTC)))
            return len(claimed) >= len(waiting) + len(alive)

        await until(all_claimed, what="every task claimed")
        assert sorted(t.idempotency_key for t in claimed) == sorted([*waiting, *alive])
        assert all(t.attempt == 1 for t in claimed)
        assert all(t.state is TaskState.RUNNING for t in claimed)
        assert await node.store.claim("default", ["q"], "w", 1000, datetime.now(UTC)) == []
    finally:
        await client.close()
        with contextlib.suppress(Exception):
            pg.start()


async def test_a_node_without_a_dsn_for_a_registered_shard_uses_the_registered_one(
    make_node: NodeFactory,
    etcd: Any,
    cluster_name: str,
    dsn: str,
    second: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A later node given no --store-shard reaches shard-1 by its masked DSN in etcd, with
    the password from the libpq password file; the password never reached etcd."""
    first: Node = await make_node(
        cluster=cluster(etcd, cluster_name), node_id="n0", store_shards=(second,)
    )
    await settled([first])
    parts = urlsplit(second)
    assert parts.password
    etcd_client = connect(etcd.client_settings(cluster_name))
    try:
        registered = await etcd_client.get(Keys(cluster_name).shard_dsn("shard-1"))
    finally:
        await etcd_client.close()
    assert registered is not None
    assert parts.password not in registered.value.decode()
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:*:{parts.password}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    later: Node = await make_node(cluster=cluster(etcd, cluster_name), node_id="n1")
    await settled([first, later])
    assert later.shard_stores is not None
    assert set(later.shard_stores.stores) == {"shard-0", "shard-1"}
    assert await later.shard_stores.stores["shard-1"].probe()


async def test_a_store_with_tasks_upgraded_to_shards_keeps_every_partition_on_shard_0(
    make_node: NodeFactory, etcd: Any, cluster_name: str, dsn: str, second: str
) -> None:
    """A single store that already holds tasks, whose first cluster node is given a second
    shard: an even split would leave half its tasks on a shard-0 that no longer holds their
    partitions. The first map registers both shards with every partition on shard-0, and
    the tasks of every partition still fire there."""
    alone = await make_node(node_id="alone")
    client = Client(alone.address)
    try:
        due = datetime.now(UTC) + timedelta(seconds=2)
        keys = [*keys_on("shard-0", 3, "old-a"), *keys_on("shard-1", 3, "old-b")]
        for key in keys:
            await client.submit("q", idempotency_key=key, run_at=due)
    finally:
        await client.close()
        await alone.stop()
    node = await make_node(
        cluster=cluster(etcd, cluster_name), node_id="n0", store_shards=(second,)
    )
    await settled([node])
    etcd_client = connect(etcd.client_settings(cluster_name))
    try:
        stored = await etcd_client.get(Keys(cluster_name).shard_map)
        assert stored is not None
        first_map = ShardMap.from_json(stored.value)
    finally:
        await etcd_client.close()
    assert first_map.shards == ("shard-0", "shard-1")
    assert first_map.held_by("shard-0") == tuple(range(P))

    async def fired() -> bool:
        return (await count_rows(dsn)).get("scheduled", 0) == 0

    await until(fired, what="every old task fired on shard-0")
    assert sum((await count_rows(dsn)).values()) == len(keys)
    assert sum((await count_rows(second)).values()) == 0


async def listening_on(dsn: str) -> int:
    """Sessions LISTENing for chronoq's notices on the database of ``dsn``."""
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        found: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'chronoq-listen' AND datname = current_database()"
        )
    finally:
        await conn.close()
    return found


async def test_one_shard_down_leaves_no_listening_connection_open_on_the_others(
    make_node: NodeFactory,
    etcd: Any,
    cluster_name: str,
    dsn: str,
    second: str,
    pg: EmbeddedPostgres,
) -> None:
    """Each pass that finds the notices' listening lost (one shard down) opens it again on
    every shard: the parts still open on the other shards are closed first, not left to the
    driver's finalizer (an unclosed-connection warning each, and sessions that pile up)."""
    node = await make_node(
        cluster=cluster(etcd, cluster_name), node_id="n0", store_shards=(second,)
    )
    await settled([node])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        pg.stop()
        await seen_down(node, "shard-1")
        await asyncio.sleep(3)  # the listening loops open it again every second
        most = 0
        for _ in range(10):
            most = max(most, await listening_on(dsn))
            await asyncio.sleep(0.2)
        gc.collect()
    # One per channel (ready, soon), and the next pass's while it replaces the last one.
    assert most <= 4
    unclosed = [str(w.message) for w in caught if "unclosed connection" in str(w.message)]
    assert unclosed == []
