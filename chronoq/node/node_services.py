"""What a node serves: the gRPC services on its port, their health, the metrics page;
and the bounds of the messages it reads and sends."""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from chronoq.api.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from chronoq.clock import Clock
from chronoq.config import NodeSettings
from chronoq.coordinator.protocols import Ownership
from chronoq.limits import MAX_IDEMPOTENCY_KEY, MAX_NAME
from chronoq.node.dispatch.gate import Gate
from chronoq.node.dispatch.handoff import HandOff
from chronoq.node.dispatch.readiness import ReadyNotifier
from chronoq.node.dispatch.submit_handoff import SubmitHandOff
from chronoq.node.dispatch.work_stream import Openings
from chronoq.node.edge.cluster_service import ClusterService
from chronoq.node.edge.schedule_service import ScheduleService
from chronoq.node.edge.service import TaskService
from chronoq.node.edge.worker_service import WorkerService
from chronoq.node.housekeeping import (
    DepthPoller,
)
from chronoq.node.metrics import LiveCollector, LoopCollector, NodeMetrics, PausedCollector
from chronoq.node.node_shards import NodeStore
from chronoq.node.owner.engine import Owner
from chronoq.node.queue_counts import QueueGaugeCollector, QueueGauges
from chronoq.node.shard_admin import ShardAdmin
from chronoq.partitionmap import PartitionMap
from chronoq.ratelimit import Quotas
from chronoq.store.port import ScheduleAdmin
from chronoq.store.sharded import ShardedStore
from chronoq.supervision import Supervisor

log = logging.getLogger("chronoq.node")

#: Bytes of one task spec apart from its payload, every field at its limit: queue, namespace
#: and idempotency key at their lengths, the numbers, durations and framing.
SPEC_BYTES = 2 * MAX_NAME + MAX_IDEMPOTENCY_KEY + 256
#: Payload bytes one request may carry in all (64 payloads at the 256 KiB limit); a client
#: with more splits its batch.
REQUEST_PAYLOAD_BYTES = 16 * 1024 * 1024
#: What a node sends at most: a listing page is bounded in bytes, a SubmitBatch answer echoes
#: a request of at most ``max_request_bytes``.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


def max_request_bytes(max_batch: int) -> int:
    """The largest message a node reads: a SubmitBatch of ``max_batch`` specs with every field
    at its limit plus ``REQUEST_PAYLOAD_BYTES`` of payloads (27 MB with the defaults). A larger
    message is refused (RESOURCE_EXHAUSTED) before it is parsed."""
    return max_batch * SPEC_BYTES + REQUEST_PAYLOAD_BYTES


SERVICE_NAMES = (
    tasks_pb2.DESCRIPTOR.services_by_name["TaskService"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
    schedules_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name,
)

#: The shortest interval between a client's keepalive pings that the server accepts; half of
#: the clients' (``chronoq.client.pool.KEEPALIVE_TIME_MS``) so timer jitter never counts.
MIN_CLIENT_PING_INTERVAL_MS = 500


class NodeServices:
    """What the node serves: its gRPC services, their health, the metrics page."""

    settings: NodeSettings
    clock: Clock
    store: NodeStore | None
    ownership: Ownership | None
    supervisor: Supervisor
    api_clock: Clock
    owner: Owner | None
    schedules: ScheduleAdmin | None
    shard_admin: ShardAdmin | None
    partition_map: PartitionMap
    quotas: Quotas | None
    notifier: ReadyNotifier
    handoff: HandOff
    gate: Gate
    openings: Openings
    submit_handoff: SubmitHandOff | None
    metrics: NodeMetrics
    metrics_port: int | None
    depth: DepthPoller | None
    queue_gauges: QueueGauges | None
    _health: health.aio.HealthServicer

    def _add_services(self, server: grpc.aio.Server) -> None:
        assert self.store is not None and self.ownership is not None and self.owner is not None
        owner = self.owner
        s = self.settings
        #: Submits of tasks due at once, leased by their insert to a stream waiting here.
        self.submit_handoff = (
            SubmitHandOff(self.store, self.handoff, self.notifier) if s.handoff else None
        )
        task_service = TaskService(
            self.store,
            self.api_clock,
            s,
            self.notifier,
            self.metrics,
            dispatch=owner.dispatch,
            quotas=self.quotas,
            handoff=self.submit_handoff,
            gate=self.gate,
        )
        tasks_pb2_grpc.add_TaskServiceServicer_to_server(  # type: ignore[no-untyped-call]
            task_service, server
        )
        worker_service = WorkerService(
            self.store,
            self.api_clock,
            s,
            self.notifier,
            self.metrics,
            dispatch=owner.dispatch,
            openings=self.openings,
            handoff=self.handoff,
            gate=self.gate,
        )
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(  # type: ignore[no-untyped-call]
            worker_service, server
        )
        sharded = self.store
        cluster_pb2_grpc.add_ClusterServiceServicer_to_server(  # type: ignore[no-untyped-call]
            ClusterService(
                self.store,
                self.api_clock,
                s,
                self.ownership,
                owner.figures,
                partitions=self.partition_map,
                shards=self.shard_admin,
                shard_stores=(
                    (lambda: sharded.stores) if isinstance(sharded, ShardedStore) else None
                ),
            ),
            server,
        )
        assert self.schedules is not None
        schedules_pb2_grpc.add_ScheduleServiceServicer_to_server(  # type: ignore[no-untyped-call]
            ScheduleService(self.schedules, self.api_clock, s), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )

    def _start_metrics(self) -> None:
        s = self.settings
        ownership = self.ownership
        assert ownership is not None
        lease = getattr(ownership, "lease", None)
        self.metrics.add_collector(
            LiveCollector(
                owned=lambda: len(ownership.owned()),
                lease=lambda: (lease.renewals, lease.losses) if lease is not None else (0, 0),
                depth=lambda: self.depth.depth if self.depth is not None else {},
            )
        )
        self.metrics.add_collector(QueueGaugeCollector(lambda: self.queue_gauges))
        self.metrics.add_collector(LoopCollector(lambda: self.supervisor.loops))
        self.metrics.add_collector(PausedCollector(self.gate.paused, s.metrics_queues))
        if s.metrics_port is not None:
            self.metrics_port = self.metrics.serve(s.metrics_host, s.metrics_port)
            log.info(
                "metrics on http://%s:%d/metrics (%s)",
                s.metrics_host,
                self.metrics_port,
                "bearer token" if self.metrics.page.guarded else "no token",
            )

    async def _set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)
