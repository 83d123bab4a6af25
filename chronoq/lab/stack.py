"""The lab's cluster: etcd, the store (one embedded PostgreSQL, Patroni members, or several
store shards, each its own server, started at once) and the nodes on the virtual clock.

Everything started is stopped, by PID, when the caller's ``ExitStack`` closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from chronoq.embedded.etcd import EmbeddedEtcd
from chronoq.embedded.ha import PatroniCluster
from chronoq.embedded.ha.install import ensure_patroni
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.embedded.shards import StoreShards, migrate_shards, run_together
from chronoq.local.cluster import ClusterSpec, LocalCluster


def start_cluster(
    stack: contextlib.ExitStack,
    workdir: Path,
    spec: ClusterSpec,
    *,
    pg_members: int = 1,
    store_shards: int = 1,
) -> LocalCluster:
    """Start the lab's cluster; ``stack`` stops it. More than one store shard: shard-0 and
    the others start together, each shard past shard-0 migrated before the nodes start."""
    if pg_members == 1 and store_shards == 1:
        cluster = LocalCluster(workdir, spec)
        stack.callback(cluster.stop)
        cluster.start()
        return cluster
    etcd = EmbeddedEtcd(workdir / "etcd", durable=spec.durable)
    stack.callback(etcd.stop)
    etcd.start()
    shard0: PatroniCluster | EmbeddedPostgres
    if pg_members > 1:
        shard0 = PatroniCluster(
            workdir / "postgres-ha", etcd.endpoints, members=pg_members, durable=spec.durable,
            etcd_auth=etcd.patroni_auth(),
        )  # fmt: skip
        taken = [p for a in shard0.addresses for p in (a.pg_port, a.api_port)]
        ensure_patroni()
    else:
        shard0 = EmbeddedPostgres(workdir / "postgres", durable=spec.durable)
        taken = [shard0.port]
    shards = StoreShards(
        workdir / "store-shards", store_shards, pg_members=pg_members,
        etcd_endpoints=etcd.endpoints, etcd_auth=etcd.patroni_auth() if pg_members > 1 else None,
        scope="chronoq-lab", durable=spec.durable, taken_ports=taken,
    )  # fmt: skip
    stack.callback(shard0.stop)
    stack.callback(shards.stop)
    run_together(shard0.start, shards.start)
    if isinstance(shard0, PatroniCluster):
        dsn = shard0.ensure_database(spec.database)
    else:
        dsn = shard0.ensure_database(spec.database)[0]
    shard_dsns = shards.ensure_database(spec.database)
    asyncio.run(migrate_shards(shard_dsns))
    cluster = LocalCluster(
        workdir, spec, etcd=etcd, dsn=dsn, store_shards=shard_dsns,
        postgres=shard0 if isinstance(shard0, EmbeddedPostgres) else None,
    )  # fmt: skip
    stack.callback(cluster.stop)
    cluster.start()
    return cluster
