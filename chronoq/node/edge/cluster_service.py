"""The cluster's gRPC servicer: status (members, ownership, pending per bucket) and drain."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import grpc

from chronoq.api import convert
from chronoq.api.v1 import cluster_pb2, cluster_pb2_grpc
from chronoq.buckets import bucket_of, bucket_start
from chronoq.clock import Clock
from chronoq.config import NodeSettings
from chronoq.coordinator.protocols import ClusterView, Ownership
from chronoq.errors import ChronoqError, InvalidArgument, ShardUnavailable, StoreUnavailable
from chronoq.limits import MAX_STATUS_BUCKETS
from chronoq.moves import MoveRecord
from chronoq.node.edge.status import translated
from chronoq.node.shard_admin import ShardAdmin, ShardAdminRefused
from chronoq.partitionmap import PartitionMap
from chronoq.redact import mask_dsn, mask_text
from chronoq.shardmap import ShardMap, format_partitions, shard_name, single
from chronoq.store.port import Admin, ByPartition, Reachable
from chronoq.store.rows import Fence

Ctx = grpc.aio.ServicerContext[Any, Any]

#: How long Status waits for one shard's counts and fences before it calls the shard down.
SHARD_STATUS_TIMEOUT = 3.0




class StatusStore(ByPartition, Admin, Reachable, Protocol):
    """What the status asks of the store: the partitions' counts and fences, and a probe."""


class ClusterService(cluster_pb2_grpc.ClusterServiceServicer):
    def __init__(
        self,
        store: StatusStore,
        clock: Clock,
        settings: NodeSettings,
        ownership: Ownership,
        figures: Callable[[], dict[str, float]],
        *,
        partitions: PartitionMap,
        shards: ShardAdmin | None = None,
        shard_stores: Callable[[], Mapping[str, StatusStore]] | None = None,
    ) -> None:
        self._store = store
        #: Each shard's own store (a cluster node): Status reads every shard by itself.
        self._shard_stores = shard_stores
        self._shards = shards
        self._partitions = partitions
        self._clock = clock
        self._settings = settings
        self._ownership = ownership
        #: This node's own firing figures (the owner engine's).
        self._figures = figures

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
        view = self._ownership.describe()
        shard_of = view.shard_map or single(self._partitions.count)
        counts, fences, health = await self._read_shards(shard_of, first - 1, first + horizon - 1)
        per_bucket: dict[int, int] = {}
        per_partition: dict[int, int] = {}
        for (p, b), n in counts.items():
            per_bucket[b] = per_bucket.get(b, 0) + n
            per_partition[p] = per_partition.get(p, 0) + n
        shard_map = self._shard_map(shard_of, view, per_partition, health)
        await self._add_moves(shard_map)
        watermarks = {f.partition: f.watermark for f in fences}
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

    async def _read_shards(
        self, current: ShardMap, low: int, high: int
    ) -> tuple[dict[tuple[int, int], int], list[Fence], dict[str, str]]:
        """Pending counts and fences of every partition, shard by shard (concurrently, each
        bounded by ``SHARD_STATUS_TIMEOUT``), and each shard's health: "ok" when it has just
        answered, "down" when it has not (its partitions then count nothing here)."""
        stores = self._shard_stores() if self._shard_stores is not None else None
        if stores is None:
            alone = await self._store.pending_by_bucket(self._partitions.all, low, high)
            return alone, await self._store.fences(), {shard_name(0): "ok"}

        async def read(
            name: str,
        ) -> tuple[dict[tuple[int, int], int], list[Fence]]:
            store = stores.get(name)
            if store is None:
                raise ShardUnavailable(name, "this node has no connection to it yet")
            held = current.held_by(name)
            mine = set(held)
            found = await store.pending_by_bucket(held, low, high) if held else {}
            return found, [f for f in await store.fences() if f.partition in mine]

        answers = await asyncio.gather(
            *(asyncio.wait_for(read(n), SHARD_STATUS_TIMEOUT) for n in current.shards),
            return_exceptions=True,
        )
        counts: dict[tuple[int, int], int] = {}
        fences: list[Fence] = []
        health: dict[str, str] = {}
        for name, answer in zip(current.shards, answers, strict=True):
            if isinstance(answer, StoreUnavailable | TimeoutError):
                health[name] = "down"
            elif isinstance(answer, BaseException):
                raise answer
            else:
                counts.update(answer[0])
                fences += answer[1]
                health[name] = "ok"
        fences.sort(key=lambda f: f.partition)
        return counts, fences, health

    def _shard_map(
        self,
        current: ShardMap,
        view: ClusterView,
        pending: dict[int, int],
        health: Mapping[str, str],
    ) -> cluster_pb2.ShardMapStatus:
        """The map this node routes by, with each shard's masked DSN and health, as this
        node's reads of it have just found it."""
        dsns = dict(view.shard_dsns)
        dsns.setdefault(shard_name(0), self._settings.dsn)
        shards = []
        for name in current.shards:
            held = current.held_by(name)
            shards.append(
                cluster_pb2.ShardStatus(
                    name=name,
                    dsn=mask_dsn(dsns.get(name, "")),
                    health=health.get(name, "unknown"),
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
            shard_map.moves_error = mask_text(exc.message)[:200]
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
        return self._figures()


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
