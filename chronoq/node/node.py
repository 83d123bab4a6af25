"""A scheduler node: the store, its ownership, the firing loop, the reaper and the gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
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
from chronoq.models import Task
from chronoq.node.firing import Firer
from chronoq.node.materializer import SchedulePump
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
        self.store = await Store.connect(
            s.dsn, partitions=s.partitions, bucket_seconds=s.bucket_seconds, max_size=s.pool_size
        )
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ]
        )
        self.port = server.add_insecure_port(f"{s.host}:{s.port}")
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
        )
        self.reaper = Reaper(
            self.store,
            self.ownership,
            self.clock,
            interval=s.reap_interval.total_seconds(),
            batch=s.reap_batch,
            on_requeued=self._requeued,
        )
        self.schedules = Schedules(self.store)
        self.pump = SchedulePump(
            self.schedules, self.ownership, self.clock,
            interval=s.schedule_interval.total_seconds(), lookahead=s.schedule_lookahead,
        )
        self._add_services(server)
        await server.start()
        await self.ownership.start()
        self._tasks = [
            asyncio.create_task(self.firer.run(), name="chronoq-firing"),
            asyncio.create_task(self.reaper.run(), name="chronoq-reaper"),
            asyncio.create_task(self.pump.run(), name="chronoq-schedules"),
        ]
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("node %s serving on %s", s.node_id, self.address)

    def _add_services(self, server: grpc.aio.Server) -> None:
        assert self.store is not None and self.ownership is not None and self.firer is not None
        s = self.settings
        tasks_pb2_grpc.add_TaskServiceServicer_to_server(  # type: ignore[no-untyped-call]
            TaskService(self.store, self.clock, s, self.notifier), server
        )
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(  # type: ignore[no-untyped-call]
            WorkerService(self.store, self.clock, s, self.notifier), server
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

    def partitions_changed(self, partitions: set[int]) -> None:
        """Ownership moved: forget cached watermarks and fire at once (backfill included)."""
        if self.firer is not None:
            self.firer.forget(partitions)
            self.firer.poke()

    def _fired(self, result: FireResult) -> None:
        self.notifier.notify(result.ready_by_queue)

    def _requeued(self, tasks: list[Task]) -> None:
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
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
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
        log.debug("node %s: stopped", self.settings.node_id)

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
