"""The shard map's writers on a real cluster node: AddShard, MovePartitions, Rebalance and the
move records in Status (real etcd, real PostgreSQL databases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chronoq.client import Client
from chronoq.coordinator.etcd import Keys, connect
from chronoq.errors import AccessDenied, BadRequest, PreconditionFailed
from chronoq.moves import Phase
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster

pytestmark = pytest.mark.timeout(90)

ADMIN = "admin-token-for-shards"
TENANT = "tenant-token-for-shards"


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens]\n"{ADMIN}" = ["*"]\n"{TENANT}" = ["team-a"]\n')
    path.chmod(0o600)
    return path


async def _etcd_values(etcd: Any, cluster_name: str) -> list[bytes]:
    client = connect(etcd.client_settings(cluster_name))
    try:
        return [kv.value for kv in await client.get_prefix(Keys(cluster_name).root.encode())]
    finally:
        await client.close()


async def test_add_shard_registers_an_empty_database_once_and_keeps_its_password_out_of_etcd(
    make_node: NodeFactory,
    etcd: Any,
    cluster_name: str,
    empty_db: str,
    dsn: str,
    tokens: Path,
) -> None:
    node = await make_node(cluster=cluster(etcd, cluster_name), auth_tokens=str(tokens))
    admin = Client(node.address, token=ADMIN, timeout=40)
    tenant = Client(node.address, namespace="team-a", token=TENANT, timeout=10)
    try:
        with pytest.raises(AccessDenied):
            await tenant.add_shard(empty_db)  # a tenant's token cannot change the map
        added = await admin.add_shard(empty_db)
        assert added.shard == "shard-1" and added.map_version == 2
        password = empty_db.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
        assert password and password not in added.dsn
        values = await _etcd_values(etcd, cluster_name)
        assert not any(password.encode() in v for v in values)
        status = await admin.status()
        assert status.shard_map is not None and status.shard_map.version == 2
        assert [s.name for s in status.shard_map.shards] == ["shard-0", "shard-1"]
        # The same database again, or the cluster's own shard-0, is refused.
        with pytest.raises(PreconditionFailed, match="is shard-1 already"):
            await admin.add_shard(empty_db)
        with pytest.raises(PreconditionFailed, match="is shard-0 already"):
            await admin.add_shard(dsn)
        with pytest.raises(BadRequest, match="dsn: is 5000 characters long"):
            await admin.add_shard("postgresql://x@h/" + "d" * 4983)
        with pytest.raises(PreconditionFailed, match="cannot connect to and migrate"):
            await admin.add_shard("postgresql://app:pw@127.0.0.1:1/nowhere")
        # Nothing changed by the refused calls.
        status = await admin.status()
        assert status.shard_map is not None and status.shard_map.version == 2
    finally:
        await admin.close()
        await tenant.close()


async def test_moves_are_asked_for_checked_and_shown_in_status(
    make_node: NodeFactory, etcd: Any, cluster_name: str, empty_db: str, tokens: Path
) -> None:
    node = await make_node(cluster=cluster(etcd, cluster_name), auth_tokens=str(tokens))
    admin = Client(node.address, token=ADMIN, timeout=40)
    tenant = Client(node.address, namespace="team-a", token=TENANT, timeout=10)
    try:
        await admin.add_shard(empty_db)
        with pytest.raises(BadRequest, match="partitions: range 9-3 runs backwards"):
            await admin.move_partitions("9-3", "shard-1")
        with pytest.raises(BadRequest, match="out of range"):
            await admin.move_partitions("0-16", "shard-1")
        with pytest.raises(BadRequest, match="no shard named 'shard-7'"):
            await admin.move_partitions("0-3", "shard-7")
        with pytest.raises(BadRequest, match="target"):
            await admin.move_partitions("0-3", "../owners")
        with pytest.raises(BadRequest, match="nothing to move"):
            await admin.move_partitions("0-3", "shard-0")
        with pytest.raises(AccessDenied):
            await tenant.move_partitions("0-3", "shard-1")
        plan = await admin.rebalance(dry_run=True)
        assert [(m.partitions, m.source, m.target, m.id) for m in plan] == [
            ("8-15", "shard-0", "shard-1", "")
        ]
        status = await admin.status()
        assert status.shard_map is not None and status.shard_map.moves == []  # a dry run
    finally:
        await admin.close()
        await tenant.close()


async def test_a_move_overlapping_an_open_one_is_refused_and_requests_leave_the_map_alone(
    etcd: Any, cluster_name: str, dsn: str
) -> None:
    """The request side alone, on real etcd (no node drives the records here)."""
    from chronoq.config import NodeSettings
    from chronoq.coordinator.move_book import EtcdMoveBook
    from chronoq.coordinator.moves import MoveDriver
    from chronoq.node.shard_admin import MoverStores, ShardAdmin, ShardAdminRefused
    from chronoq.shardmap import single

    keys = Keys(cluster_name)
    client = connect(etcd.client_settings(cluster_name))
    current = single(16).with_shard()
    settings = NodeSettings(dsn=dsn, partitions=16)
    stores = MoverStores(settings, dict, lambda: current)
    book = EtcdMoveBook(client, keys, lambda: None, dict)
    driver = MoveDriver(book, stores, lambda *a: None, node_id="n", leads=lambda: False)  # type: ignore[arg-type, return-value]
    admin = ShardAdmin(client, keys, settings, stores, driver, book)
    try:
        await client.put(keys.shard_map, current.to_json().encode())
        [first] = await admin.request_move("0-3", "shard-1")
        assert first.phase is Phase.REQUESTED and first.base_version == 2
        with pytest.raises(ShardAdminRefused, match=f"partition 2 is in move {first.id}"):
            await admin.request_move("2-5", "shard-1")
        [second] = await admin.request_move("4-5", "shard-1")
        assert [s.record.id for s in await book.records()] == [first.id, second.id]
        read, _rev = await book.read_map()
        assert read == current  # asking for a move changes no map
        assert await book.claim(first.id) is None  # no lease: no move key, no driver
        assert await driver.step() is None  # a node that does not lead drives nothing
    finally:
        await stores.close()
        await client.close()
