"""A scheduler node: the store, its ownership, the firing loop, the reaper and the gRPC server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

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
from chronoq.clock import Clock, SystemClock
from chronoq.config import NodeSettings
from chronoq.models import Task, TaskState
from chronoq.node.auth_interceptor import api_security
from chronoq.node.firing import Firer
from chronoq.node.housekeeping import DepthPoller, HealthWatch, Retention, StoreWatch
from chronoq.node.materializer import SchedulePump
from chronoq.node.metrics import LiveCollector, NodeMetrics
from chronoq.node.ownership import LocalOwnership, Ownership
from chronoq.node.readiness import ReadyNotifier
from chronoq.node.reaper import Reaper
from chronoq.node.schedule_service import ScheduleService
from chronoq.node.service import ClusterService, TaskService, WorkerService, node_stats
from chronoq.store import FireResult, Store
from chronoq.store.schedules import Schedules

log = logging.getLogger("chronoq.node")

SERVICE_NAMES = (
    tasks_pb2.DESCRIPTOR.services_by_name["TaskService"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
    schedules_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name,
)

OwnershipFactory = Callable[["Node", Store], Ownership]


def default_ownership(node: Node, store: Store) -> Ownership:
    """Every partition on a single node, or the etcd-coordinated share of a cluster."""
    s = node.settings
    if s.cluster is None:
        return LocalOwnership(store, s.node_id, node.address)
    from chronoq.coordinator.ownership import EtcdOwnership

    ownership = EtcdOwnership(
        store,
        s.node_id,
        node.address,
        s.cluster,
        node.clock,
        stats=lambda: node_stats(node.firer) if node.firer is not None else {},
    )
    ownership.on_acquired = node.partitions_changed
    ownership.on_released = node.partitions_changed
    return ownership


class Node:
    """One scheduler node. ``await start()``, then ``await stop()``; or ``async with``."""

    def __init__(
        self,
        settings: NodeSettings,
        *,
        clock: Clock | None = None,
        ownership: OwnershipFactory = default_ownership,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self._ownership_factory = ownership
        self.store: Store | None = None
        self.ownership: Ownership | None = None
        self.firer: Firer | None = None
        self.reaper: Reaper | None = None
        self.schedules: Schedules | None = None
        self.metrics = NodeMetrics(settings.node_id)
        self.metrics_port: int | None = None
        self.retention: Retention | None = None
        self.depth: DepthPoller | None = None
        self.health: HealthWatch | None = None
        self.store_watch: StoreWatch | None = None
        self.pump: SchedulePump | None = None
        self.notifier = ReadyNotifier()
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._tasks: list[asyncio.Task[None]] = []
        self.port = settings.port

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    async def start(self) -> None:
        """Connect the store, bind the port, take ownership, then fire and serve."""
        s = self.settings
        interceptors, credentials = api_security(
            auth_tokens=s.auth_tokens,
            tls_cert=s.tls_cert,
            tls_key=s.tls_key,
            tls_client_ca=s.tls_client_ca,
        )
        self.store = await Store.connect(
            s.dsn, partitions=s.partitions, bucket_seconds=s.bucket_seconds, max_size=s.pool_size
        )
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ],
        )
        bind = f"{s.host}:{s.port}"
        self.port = (
            server.add_secure_port(bind, credentials)
            if credentials is not None
            else server.add_insecure_port(bind)
        )
        self._server = server
        self.ownership = self._ownership_factory(self, self.store)
        self.firer = Firer(
            self.store,
            self.ownership,
            self.clock,
            tick=s.tick.total_seconds(),
            batch=s.fire_batch,
            rounds=s.fire_rounds,
            on_ready=self._fired,
            node_id=s.node_id,
            metrics=self.metrics,
        )
        self.reaper = Reaper(
            self.store,
            self.ownership,
            self.clock,
            interval=s.reap_interval.total_seconds(),
            batch=s.reap_batch,
            on_requeued=self._requeued,
        )
        self.retention = Retention(
            self.store,
            self.ownership,
            self.clock,
            retention=s.retention,
            dead_retention=s.dead_retention,
            interval=s.retention_interval.total_seconds(),
            batch=s.retention_batch,
            on_purged=self.metrics.purged.inc,
        )
        self.depth = DepthPoller(self.store, self.clock)
        self.health = HealthWatch(self.ownership, self._set_serving)
        firer = self.firer
        grace = (
            s.store_grace.total_seconds() if s.store_grace is not None
            else 0.6 * s.cluster.lease_ttl if s.cluster is not None else 6.0
        )
        self.store_watch = StoreWatch(
            self.store,
            self.ownership,
            lambda: firer.last_ok,
            grace=grace,
            # Looking is a clock comparison (no I/O while the store answers): look often, so
            # a cut-off node hands off at grace + a fraction of it, not grace + a second.
            interval=min(1.0, grace / 5),
        )
        self.schedules = Schedules(self.store)
        self.pump = SchedulePump(
            self.schedules,
            self.ownership,
            self.clock,
            interval=s.schedule_interval.total_seconds(),
            lookahead=s.schedule_lookahead,
        )
        self._add_services(server)
        await server.start()
        await self.ownership.start()
        self._tasks = [
            asyncio.create_task(self.firer.run(), name="chronoq-firing"),
            asyncio.create_task(self.reaper.run(), name="chronoq-reaper"),
            asyncio.create_task(self.pump.run(), name="chronoq-schedules"),
            asyncio.create_task(self.retention.run(), name="chronoq-retention"),
            asyncio.create_task(self.depth.run(), name="chronoq-depth"),
            asyncio.create_task(self.store_watch.run(), name="chronoq-store-watch"),
        ]
        await self.health.check()
        self._tasks.append(asyncio.create_task(self.health.run(), name="chronoq-health"))
        self._start_metrics()
        log.info("node %s serving on %s", s.node_id, self.address)

    def _add_services(self, server: grpc.aio.Server) -> None:
        assert self.store is not None and self.ownership is not None and self.firer is not None
        s = self.settings
        tasks_pb2_grpc.add_TaskServiceServicer_to_server(  # type: ignore[no-untyped-call]
            TaskService(self.store, self.clock, s, self.notifier, self.metrics), server
        )
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(  # type: ignore[no-untyped-call]
            WorkerService(self.store, self.clock, s, self.notifier, self.metrics), server
        )
        cluster_pb2_grpc.add_ClusterServiceServicer_to_server(  # type: ignore[no-untyped-call]
            ClusterService(self.store, self.clock, s, self.ownership, self.firer), server
        )
        assert self.schedules is not None
        schedules_pb2_grpc.add_ScheduleServiceServicer_to_server(  # type: ignore[no-untyped-call]
            ScheduleService(self.schedules, self.clock, s), server
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
        if s.metrics_port is not None:
            self.metrics_port = self.metrics.serve(s.metrics_host, s.metrics_port)
            log.info("metrics on http://%s:%d/metrics", s.metrics_host, self.metrics_port)

    async def _set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)

    def partitions_changed(self, partitions: set[int]) -> None:
        """Ownership moved: forget cached watermarks and fire at once (backfill included)."""
        if self.firer is not None:
            self.firer.forget(partitions)
            self.firer.poke()

    def _fired(self, result: FireResult) -> None:
        self.notifier.notify(result.ready_by_queue)

    def _requeued(self, tasks: list[Task]) -> None:
        self.metrics.reaped.inc(len(tasks))
        self.metrics.dead.inc(sum(1 for t in tasks if t.state is TaskState.DEAD))
        self.notifier.notify({(t.namespace, t.queue) for t in tasks})

    async def stop(self, grace: float = 2.0) -> None:
        """Stop firing first (no owner write after this returns), then the server, then the pool."""
        if self.store is None:
            return  # never started, or stopped already
        await self._health.enter_graceful_shutdown()
        if self.ownership is not None:
            async with self.ownership.gate:  # the owner statement in flight finishes first
                for task in self._tasks:
                    task.cancel()
        if self._tasks:
            # Bounded: a task that ignored its cancellation must not hold the stop forever.
            _done, stuck = await asyncio.wait(self._tasks, timeout=5)
            for task in stuck:
                log.error("node %s: task %s did not stop", self.settings.node_id, task.get_name())
        self._tasks = []
        log.debug("node %s: firing stopped", self.settings.node_id)
        if self.ownership is not None:
            await self.ownership.stop()
        log.debug("node %s: ownership released", self.settings.node_id)
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        log.debug("node %s: server stopped", self.settings.node_id)
        if self.store is not None:
            await self.store.close()
            self.store = None
        self.metrics.close()
        log.debug("node %s: stopped", self.settings.node_id)

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
