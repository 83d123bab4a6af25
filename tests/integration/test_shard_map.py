"""The shard map in etcd: made once per cluster, watched, refused whole when corrupt, shown by
``Status``, ``chronoq store shards`` and ``chronoq status`` (real etcd and PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from chronoq.client import Client
from chronoq.config import NodeSettings
from chronoq.coordinator.etcd import Keys, connect
from chronoq.coordinator.shards import ShardMapView
from chronoq.errors import ConfigError
from chronoq.node import Node
from chronoq.shardmap import ShardMap, single
from tests.integration.conftest import NodeFactory
from tests.integration.test_cli import cli, ok
from tests.integration.test_cluster_inproc import cluster, settled

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret-shard-pw"


def password_of(dsn: str) -> str:
    """The password the test server's DSN carries (the embedded server checks it)."""
    password = urlsplit(dsn).password
    assert password, f"the test DSN has no password: {dsn}"
    return password


async def until(check: Any, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_concurrent_first_nodes_make_one_version_1_map(etcd: Any, cluster_name: str) -> None:
    settings = etcd.client_settings(cluster_name)
    keys = Keys(cluster_name)
    clients = [connect(settings) for _ in range(4)]
    try:
        views = [
            ShardMapView(c, keys, 16, f"postgresql://app:{SECRET}@db{i}/x")
            for i, c in enumerate(clients)
        ]
        created = await asyncio.gather(*(v.create_if_absent() for v in views))
        assert sorted(created) == [False, False, False, True]
        stored = await clients[0].get(keys.shard_map)
        assert stored is not None
        assert ShardMap.from_json(stored.value) == single(16)
        dsns = await clients[0].get_prefix(keys.shard_dsns)
        assert [kv.key for kv in dsns] == [keys.shard_dsn("shard-0")]
        assert SECRET not in dsns[0].value.decode()
        assert stored.version == 1  # written once, never overwritten by the later nodes
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()


async def test_a_corrupt_map_is_refused_and_the_last_good_one_kept(
    etcd: Any, cluster_name: str
) -> None:
    settings = etcd.client_settings(cluster_name)
    keys = Keys(cluster_name)
    client = connect(settings)
    view = ShardMapView(client, keys, 16, "postgresql://app@db/x")
    try:
        await view.start()
        assert view.current == single(16)
        for corrupt in (
            b"{not json",
            b'{"format":1,"version":2,"partitions":16,"shards":{"shard-0":"0-14"}}',
            b'{"format":1,"version":2,"partitions":16,"shards":{"shard-0":"0-15","shard-1":"3"}}',
            single(32).with_shard().to_json().encode(),  # another partition count
        ):
            before = view.error
            await client.put(keys.shard_map, corrupt)
            await until(lambda b=before: view.error is not None and view.error != b)
            assert view.current == single(16), corrupt
        good = single(16).with_shard()
        await client.put(keys.shard_map, good.to_json().encode())
        await until(lambda: view.current == good)
        assert view.error is None
    finally:
        await view.stop()
        await client.close()


async def test_a_node_with_another_partition_count_refuses_to_start(
    make_node: NodeFactory, etcd: Any, cluster_name: str, dsn: str
) -> None:
    settings = cluster(etcd, cluster_name)
    await make_node(cluster=settings, node_id="p16")
    other = Node(
        NodeSettings(
            dsn=dsn,
            port=0,
            partitions=32,
            tick=timedelta(milliseconds=50),
            cluster=settings,
            node_id="p32",
        )
    )
    try:
        with pytest.raises(ConfigError, match="--partitions 16"):
            await other.start()
        # The map is read before the stores open and the ownership is made: nothing taken.
        assert other.store is None
        assert other.ownership is None or not other.ownership.owned()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(other.stop(grace=0.1), 20)
    client = connect(etcd.client_settings(cluster_name))
    try:
        members = await client.get_prefix(Keys(cluster_name).members)
        assert [kv.key.rsplit(b"/", 1)[-1] for kv in members] == [b"p16"]
    finally:
        await client.close()


async def test_status_and_cli_show_shard_0_with_every_partition_and_a_masked_dsn(
    make_node: NodeFactory, etcd: Any, cluster_name: str, dsn: str
) -> None:
    settings = cluster(etcd, cluster_name)
    secret = password_of(dsn)
    nodes = [await make_node(cluster=settings, node_id=f"m{i}") for i in range(2)]
    await settled(nodes)
    client = Client(nodes[1].address)
    try:
        status = await client.status()
    finally:
        await client.close()
    assert status.shard_map is not None
    assert status.shard_map.version == 1
    [shard] = status.shard_map.shards
    assert (shard.name, shard.partitions, shard.partition_count) == ("shard-0", "0-15", 16)
    assert shard.health == "ok"
    assert secret not in shard.dsn and "***" in shard.dsn
    assert urlsplit(shard.dsn).hostname == urlsplit(dsn).hostname
    assert status.shard_map.moves_in_progress == 0
    assert {o.partition: o.shard for o in status.ownership} == dict.fromkeys(range(16), "shard-0")

    address = ",".join(n.address for n in nodes)
    shards_out = ok(await cli("store", "shards", "--json", "--address", address))
    assert secret not in shards_out
    listed = json.loads(shards_out)
    assert listed["version"] == 1
    assert [(s["name"], s["partitions"], s["health"]) for s in listed["shards"]] == [
        ("shard-0", "0-15", "ok")
    ]
    assert listed["moves_in_progress"] == 0
    table = ok(await cli("store", "shards", "--address", address))
    assert "shard-0" in table and "moves in progress: none" in table and secret not in table

    status_out = ok(await cli("status", "--json", "--address", nodes[0].address))
    assert secret not in status_out
    doc = json.loads(status_out)
    assert {o["partition"]: o["shard"] for o in doc["ownership"]} == dict.fromkeys(
        range(16), "shard-0"
    )
    # Nothing in etcd holds the password either.
    raw = connect(etcd.client_settings(cluster_name))
    try:
        everything = await raw.get_prefix(Keys(cluster_name).root.encode())
        assert all(secret.encode() not in kv.value for kv in everything)
    finally:
        await raw.close()
