"""The cluster calls of ``Client``: status, drain, and the store shards' admin (add a shard,
move partitions, rebalance)."""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from typing import Any

from chronoq.api import convert
from chronoq.api.v1 import cluster_pb2
from chronoq.client.values import (
    AddedShard,
    BucketCount,
    ClusterStatus,
    MemberStatus,
    MoveStatus,
    PartitionStatus,
    ShardMapStatus,
    ShardStatus,
)


class ClusterCalls:
    """``status``, ``drain``, ``add_shard``, ``move_partitions`` and ``rebalance`` (a base of
    ``Client``, which provides ``_call``)."""

    _call: Callable[..., Awaitable[Any]]

    async def drain(self) -> builtins.list[int]:
        """Ask this node to hand off its partitions and take no more; returns them."""
        resp = await self._call(lambda n: n.cluster.Drain, cluster_pb2.DrainRequest())
        return list(resp.released)

    async def add_shard(self, dsn: str) -> AddedShard:
        """Register an empty PostgreSQL database as the next store shard (admin token)."""
        resp = await self._call(
            lambda n: n.cluster.AddShard, cluster_pb2.AddShardRequest(dsn=dsn), timeout=60
        )
        return AddedShard(resp.shard, resp.dsn, resp.map_version)

    async def move_partitions(self, partitions: str, target: str) -> builtins.list[MoveStatus]:
        """Ask for ``partitions`` (a list such as ``0-63``) to move to shard ``target`` online;
        the moves asked for (``status().shard_map.moves`` follows them). Admin token."""
        req = cluster_pb2.MovePartitionsRequest(partitions=partitions, target=target)
        resp = await self._call(lambda n: n.cluster.MovePartitions, req)
        return [_move_status(m) for m in resp.moves]

    async def rebalance(self, *, dry_run: bool = False) -> builtins.list[MoveStatus]:
        """Even out the partitions per shard: the moves planned (``dry_run``) or asked for."""
        req = cluster_pb2.RebalanceRequest(dry_run=dry_run)
        resp = await self._call(lambda n: n.cluster.Rebalance, req, retry=dry_run)
        return [_move_status(m) for m in resp.moves]

    async def status(self, bucket_horizon: int = 10) -> ClusterStatus:
        resp = await self._call(
            lambda n: n.cluster.Status,
            cluster_pb2.StatusRequest(bucket_horizon=bucket_horizon),
            retry=True,
        )
        return ClusterStatus(
            cluster=resp.cluster,
            node_id=resp.node_id,
            now=convert.from_timestamp("now", resp.now),
            partitions=resp.partitions,
            bucket_seconds=resp.bucket_seconds,
            members=[
                MemberStatus(
                    m.node_id,
                    m.address,
                    m.owned_partitions,
                    m.lateness_p50_ms,
                    m.lateness_p99_ms,
                    m.fired_total,
                )
                for m in resp.members
            ],
            ownership=[
                PartitionStatus(o.partition, o.owner, o.fencing_token, o.watermark_bucket, o.shard)
                for o in resp.ownership
            ],
            buckets=[
                BucketCount(b.bucket, convert.from_timestamp("starts_at", b.starts_at), b.pending)
                for b in resp.buckets
            ],
            firing_partitions=list(resp.firing_partitions),
            shard_map=ShardMapStatus(
                version=resp.shard_map.version,
                shards=[
                    ShardStatus(s.name, s.dsn, s.health, s.partitions, s.partition_count, s.pending)
                    for s in resp.shard_map.shards
                ],
                moves_in_progress=resp.shard_map.moves_in_progress,
                error=resp.shard_map.error,
                moves=[_move_status(m) for m in resp.shard_map.moves],
                moves_error=resp.shard_map.moves_error,
            )
            if resp.HasField("shard_map")
            else None,
        )


def _move_status(m: Any) -> MoveStatus:
    return MoveStatus(
        m.id,
        m.partitions,
        m.source,
        m.target,
        m.phase,
        m.rows_copied,
        m.rounds,
        m.next_version,
        m.driver,
        m.error,
    )
