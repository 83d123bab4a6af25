"""The cluster's gRPC servicer: status (members, ownership, pending per bucket) and drain."""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from chronoq.api import convert
from chronoq.api.v1 import cluster_pb2, cluster_pb2_grpc
from chronoq.buckets import bucket_of, bucket_start
from chronoq.clock import Clock
from chronoq.config import NodeSettings
from chronoq.coordinator.protocols import ClusterView, Ownership
from chronoq.errors import ChronoqError, InvalidArgument
from chronoq.limits import MAX_STATUS_BUCKETS
from chronoq.moves import MoveRecord
from chronoq.node.firing import Firer
from chronoq.node.shard_admin import ShardAdmin, ShardAdminRefused
from chronoq.node.status import translated
from chronoq.partitionmap import PartitionMap
from chronoq.redact import mask_dsn
from chronoq.shardmap import ShardMap, format_partitions, shard_name, single
from chronoq.store.port import Admin, ByPartition, Reachable

Ctx = grpc.aio.ServicerContext[Any, Any]




class StatusStore(ByPartition, Admin, Reachable, Protocol):
    """What the status asks of the store: the partitions' counts and fences, and a probe."""


class ClusterService(cluster_pb2_grpc.ClusterServiceServicer):
    def __init__(
        self,
        store: StatusStore,
        clock: Clock,
        settings: NodeSettings,
        ownership: Ownership,
        firer: Firer,
        *,
        partitions: PartitionMap,
        shards: ShardAdmin | None = None,
    ) -> None:
        self._store = store
        self._shards = shards
        self._partitions = partitions
        self._clock = clock
        self._settings = settings
        self._ownership = ownership
        self._firer = firer

    @translated
    async def Status(
        self, request: cluster_pb2.StatusRequest, context: Ctx
    ) -> cluster_pb2.StatusResponse:
        now = self._clock.now()
        width = self._settings.bucket_seconds
        horizon = request.bucket_horizon or 10
        if horizon > MAX_STATUS_BUCKETS:
            raise InvalidArgument("bucket_horizon", f"must be at most {MAX_STATUS_BUCKETS} buckets")
        first = bucket_of(now, width)
        counts = await self._store.pending_by_bucket(
            self._partitions.all, first - 1, first + horizon - 1
        )
        per_bucket: dict[int, int] = {}
        per_partition: dict[int, int] = {}
        for (p, b), n in counts.items():
            per_bucket[b] = per_bucket.get(b, 0) + n
            per_partition[p] = per_partition.get(p, 0) + n
        view = self._ownership.describe()
        shard_of = view.shard_map or single(self._partitions.count)
        shard_map = self._shard_map(shard_of, view, per_partition)
        await self._add_moves(shard_map)
        watermarks = {f.partition: f.watermark for f in await self._store.fences()}
        members = []
        for m in view.members:
            stats = m.stats
            if m.node_id == self._settings.node_id:
                stats = self._local_stats()
            members.append(
                cluster_pb2.Member(
                    node_id=m.node_id,
                    address=m.address,
                    owned_partitions=sum(1 for n, _t in view.owners.values() if n == m.node_id),
                    lateness_p50_ms=stats.get("lateness_p50_ms", 0.0),
                    lateness_p99_ms=stats.get("lateness_p99_ms", 0.0),
                    fired_total=int(stats.get("fired", 0)),
                )
            )
        return cluster_pb2.StatusResponse(
            cluster=view.cluster,
            node_id=self._settings.node_id,
            now=convert.to_timestamp(now),
            partitions=self._partitions.count,
            bucket_seconds=width,
            members=members,
            ownership=[
                cluster_pb2.PartitionOwnership(
                    partition=p,
                    owner=node,
                    fencing_token=token,
                    watermark_bucket=watermarks.get(p, 0),
                    shard=shard_of.shard_of(p) if p < shard_of.partitions else "",
                )
                for p, (node, token) in sorted(view.owners.items())
            ],
            buckets=[
                cluster_pb2.BucketCount(
                    bucket=b,
                    starts_at=convert.to_timestamp(bucket_start(b, width)),
                    pending=per_bucket.get(b, 0),
                )
                for b in range(first - 1, first + horizon)
            ],
            firing_partitions=sorted(self._ownership.owned()),
            shard_map=shard_map,
        )

    def _shard_map(
        self, current: ShardMap, view: ClusterView, pending: dict[int, int]
    ) -> cluster_pb2.ShardMapStatus:
        """The map this node routes by, with each shard's masked DSN and health: today a node
        reaches only ``shard-0`` (its own store, which has just answered this call's counts,
        so it is healthy), and the other shards' health is unknown."""
        dsns = dict(view.shard_dsns)
        dsns.setdefault(shard_name(0), self._settings.dsn)
        shards = []
        for name in current.shards:
            held = current.held_by(name)
            shards.append(
                cluster_pb2.ShardStatus(
                    name=name,
                    dsn=mask_dsn(dsns.get(name, "")),
                    health="ok" if name == shard_name(0) else "unknown",
                    partitions=format_partitions(held),
                    partition_count=len(held),
                    pending=sum(pending.get(p, 0) for p in held),
                )
            )
        return cluster_pb2.ShardMapStatus(
            version=current.version,
            shards=shards,
            moves_in_progress=0,  # counted from the move records (_add_moves)
            error=view.shard_map_error or "",
        )

    async def _add_moves(self, shard_map: cluster_pb2.ShardMapStatus) -> None:
        """The move records in etcd, open ones counted as in progress."""
        if self._shards is None:
            return
        try:
            records = await self._shards.moves()
        except ChronoqError as exc:
            shard_map.moves_error = exc.message[:200]
            return
        shard_map.moves.extend(move_status(r) for r in records)
        shard_map.moves_in_progress = sum(1 for r in records if not r.final)

    def _admin(self) -> ShardAdmin:
        if self._shards is None:
            raise ShardAdminRefused(
                "this node runs without etcd: store shards need a cluster (start nodes with "
                "--etcd)"
            )
        return self._shards

    @translated
    async def AddShard(
        self, request: cluster_pb2.AddShardRequest, context: Ctx
    ) -> cluster_pb2.AddShardResponse:
        added = await self._admin().add_shard(request.dsn)
        return cluster_pb2.AddShardResponse(
            shard=added.name, dsn=added.dsn, map_version=added.map_version
        )

    @translated
    async def MovePartitions(
        self, request: cluster_pb2.MovePartitionsRequest, context: Ctx
    ) -> cluster_pb2.MovePartitionsResponse:
        if not request.target:
            raise InvalidArgument("target", "name the shard to move to, e.g. shard-1")
        records = await self._admin().request_move(request.partitions, request.target)
        return cluster_pb2.MovePartitionsResponse(moves=[move_status(r) for r in records])

    @translated
    async def Rebalance(
        self, request: cluster_pb2.RebalanceRequest, context: Ctx
    ) -> cluster_pb2.RebalanceResponse:
        records = await self._admin().rebalance(request.dry_run)
        return cluster_pb2.RebalanceResponse(moves=[move_status(r) for r in records])

    @translated
    async def Drain(
        self, request: cluster_pb2.DrainRequest, context: Ctx
    ) -> cluster_pb2.DrainResponse:
        released = await self._ownership.drain()
        return cluster_pb2.DrainResponse(node_id=self._settings.node_id, released=sorted(released))

    def _local_stats(self) -> dict[str, float]:
        return node_stats(self._firer)


def move_status(record: MoveRecord) -> cluster_pb2.MoveStatus:
    return cluster_pb2.MoveStatus(
        id=record.id,
        partitions=format_partitions(record.partitions),
        source=record.source,
        target=record.target,
        phase=record.phase.value,
        rows_copied=record.rows_copied,
        rounds=record.rounds,
        next_version=record.next_version,
        driver=record.driver,
        error=record.error,
    )


def node_stats(firer: Firer) -> dict[str, float]:
    """The figures a node publishes about itself (status, the lab)."""
    return {
        "lateness_p50_ms": firer.lateness.percentile(50) * 1000,
        "lateness_p99_ms": firer.lateness.percentile(99) * 1000,
        "fired": float(firer.stats.fired),
    }
