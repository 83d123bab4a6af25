"""Multi-node fixtures: node processes on the session's etcd and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.local.cluster import ClusterSpec, LocalCluster
from tests.conftest import create_test_database

ClusterFactory = Callable[..., LocalCluster]


@pytest.fixture
def make_cluster(
    tmp_path: Path, postgres: EmbeddedPostgres, template_db: str, etcd: Any
) -> Iterator[ClusterFactory]:
    """Start a LocalCluster of node processes on a fresh database and a fresh etcd prefix;
    every process is stopped at the end, even when the test fails."""
    started: list[LocalCluster] = []
    databases: list[str] = []

    def make(*, store_shards: Sequence[str] = (), **spec: Any) -> LocalCluster:
        db = f"c_{uuid.uuid4().hex[:12]}"
        dsn = create_test_database(postgres, db, template_db)
        databases.append(db)
        fields: dict[str, Any] = {
            "nodes": 3,
            "partitions": 16,
            "lease_ttl": 2,
            "tick_ms": 50,
            "cluster": f"c{uuid.uuid4().hex[:8]}",
            "durable": False,
        }
        fields.update(spec)
        cluster = LocalCluster(
            tmp_path / f"cluster{len(started)}",
            ClusterSpec(**fields),
            postgres=postgres,
            etcd=etcd,
            dsn=dsn,
            store_shards=store_shards,
        )
        started.append(cluster)
        cluster.start()
        return cluster

    try:
        yield make
    finally:
        for cluster in started:
            cluster.stop()
        for db in databases:
            postgres.drop_database(db)
