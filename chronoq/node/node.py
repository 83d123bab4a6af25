"""A scheduler node: the store, its ownership, the firing loop, the reaper and the gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health

from chronoq import tracing
from chronoq.clock import Clock, SystemClock
from chronoq.config import NodeSettings
from chronoq.coordinator.local import LocalOwnership
from chronoq.coordinator.ownership import EtcdOwnership
from chronoq.coordinator.protocols import Ownership
from chronoq.coordinator.shards import ShardMapView
from chronoq.errors import ChronoqError
from chronoq.node.clock_check import ClockCheck, CorrectedClock, follows_wall_clock
from chronoq.node.dispatch.gate import Gate
from chronoq.node.dispatch.handoff import HandOff
from chronoq.node.dispatch.readiness import ReadyBroadcast, ReadyNotifier, ReadyProbe
from chronoq.node.dispatch.submit_handoff import SubmitHandOff
from chronoq.node.dispatch.work_stream import Openings
from chronoq.node.edge.auth_interceptor import api_security
from chronoq.node.edge.malformed import MalformedRequests
from chronoq.node.edge.service import submit_quotas
from chronoq.node.housekeeping import (
    DepthPoller,
    HealthWatch,
    Retention,
    StoreWatch,
    reachable_elsewhere,
)
from chronoq.node.metrics import NodeMetrics, scrape_token
from chronoq.node.node_loops import NodeLoops
from chronoq.node.node_services import (
    MAX_RESPONSE_BYTES,
    MIN_CLIENT_PING_INTERVAL_MS,
    REQUEST_PAYLOAD_BYTES,
    SERVICE_NAMES,
    SPEC_BYTES,
    NodeServices,
    max_request_bytes,
)
from chronoq.node.node_shards import SHARD_OK_PREFIX, STORE_HEALTH_PREFIX, NodeStore
from chronoq.node.owner.engine import Owner
from chronoq.node.owner.firing import Firer
from chronoq.node.owner.materializer import SchedulePump
from chronoq.node.owner.reaper import Reaper
from chronoq.node.queue_counts import LIVE_BATCH, LIVE_STATES, QueueGauges, QueueRecount
from chronoq.node.shard_admin import ShardAdmin
from chronoq.node.shard_admin import attach as attach_shard_admin
from chronoq.node.shards import ShardStores, ShardWatch
from chronoq.partitionmap import PartitionMap
from chronoq.store import Store
from chronoq.store.pool_logs import quiet_pool_outages
from chronoq.store.schedules import Schedules
from chronoq.store.sharded import ShardedSchedules, ShardedStore
from chronoq.supervision import Loop, LoopPolicy, Supervisor

__all__ = [
    "MAX_RESPONSE_BYTES",
    "MIN_CLIENT_PING_INTERVAL_MS",
    "REQUEST_PAYLOAD_BYTES",
    "SERVICE_NAMES",
    "SHARD_OK_PREFIX",
    "SPEC_BYTES",
    "STORE_HEALTH_PREFIX",
    "Node",
    "NodeStore",
    "OwnershipFactory",
    "default_ownership",
    "max_request_bytes",
]

log = logging.getLogger("chronoq.node")

OwnershipFactory = Callable[["Node", NodeStore], Ownership]


def default_ownership(node: Node, store: NodeStore) -> Ownership:
    """Every partition on a single node, or the etcd-coordinated share of a cluster."""
    s = node.settings
    if s.cluster is None:
        return LocalOwnership(store, s.node_id, node.address, partitions=node.partition_map)
    view = node.shard_map
    ownership = EtcdOwnership(
        store,
        s.node_id,
        node.address,
        s.cluster,
        node.clock,
        partitions=node.partition_map,
        stats=node.published_stats,
        supervisor=node.supervisor,
        store_dsn=s.dsn,
        client=view.client if view is not None else None,
        shard_map=view,
    )
    ownership.on_acquired = node.partitions_changed
    ownership.on_released = node.partitions_changed
    return ownership


class Node(NodeServices, NodeLoops):
    """One scheduler node. ``await start()``, then ``await stop()``; or ``async with``."""

    def __init__(
        self,
        settings: NodeSettings,
        *,
        clock: Clock | None = None,
        ownership: OwnershipFactory = default_ownership,
        loop_policy: LoopPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self._ownership_factory = ownership
        #: The partitions of the cluster, from the settings (the store is made with the same).
        self.partition_map = PartitionMap(settings.partitions)
        self.store: NodeStore | None = None
        #: The cluster's shard map (None: a node alone, whose one store is ``shard-0``).
        self.shard_map: ShardMapView | None = None
        self.shard_stores: ShardStores[Store] | None = None
        self.shard_watch: ShardWatch | None = None
        self._shards_wanted = asyncio.Event()  # the map names a shard without a store
        self.ownership: Ownership | None = None
        #: The owner engine: tick, timing wheel, near-future notices and the dispatcher.
        self.owner: Owner | None = None
        self.reaper: Reaper | None = None
        self.schedules: Schedules | ShardedSchedules | None = None
        # The metrics token is read now: a bad token file stops the node before it starts.
        self.metrics = NodeMetrics(settings.node_id, token=scrape_token(settings))
        self.metrics_port: int | None = None
        self.retention: Retention | None = None
        self.depth: DepthPoller | None = None
        self.queue_recount: QueueRecount | None = None
        self.live_recount: QueueRecount | None = None
        self.queue_gauges: QueueGauges | None = None
        self.health: HealthWatch | None = None
        self.store_watch: StoreWatch | None = None
        self.clock_check: ClockCheck | None = None
        self.api_clock: Clock = self.clock  # corrected while the clock check finds it off
        self.pump: SchedulePump | None = None
        #: Each namespace's submit quota on this node, taken by submits and by the
        #: occurrences its schedules make here (None: no quota).
        self.quotas = submit_quotas(settings)
        self.notifier = ReadyNotifier()
        #: The dispatch gate: the queues never handed off (a dispatch limit, paused, limited
        #: per key), read by the claims, the streams and the hand-offs.
        self.gate = Gate()
        #: This node's worker streams, which the wheel may lease fired tasks to.
        self.handoff = HandOff(self.gate.known)
        self.submit_handoff: SubmitHandOff | None = None
        #: Worker streams not opened yet: one count for the interceptor and the servicer, so
        #: the caps per node and per token hold across both.
        self.openings = Openings()
        self.probe: ReadyProbe | None = None
        self.broadcast: ReadyBroadcast | None = None
        #: The shard map's writers and the move driver (None: a node without etcd).
        self.shard_admin: ShardAdmin | None = None
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        # Every background loop of the node (its ownership's too) runs under one supervisor,
        # whose health is part of the node's.
        self.supervisor = Supervisor(loop_policy)
        self._loops: list[Loop] = []
        self.port = settings.port

    @property
    def firer(self) -> Firer | None:
        """The owner engine's tick (None before start), as benchmarks read its figures."""
        return self.owner.tick if self.owner is not None else None

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    async def start(self) -> None:
        """Connect the store, bind the port, take ownership, then fire and serve."""
        s = self.settings
        tracing.configure_from_env("chronoq-node")  # off unless an OTLP endpoint is set
        interceptors, credentials = api_security(
            auth_tokens=s.auth_tokens,
            tls_cert=s.tls_cert,
            tls_key=s.tls_key,
            tls_client_ca=s.tls_client_ca,
            openings=self.openings,
        )
        quiet_pool_outages()  # an outage is reported by the loops, once
        self.store = await self._open_stores()
        server = grpc.aio.server(
            # MalformedRequests first: it wraps the others, which then never see garbage.
            interceptors=[MalformedRequests(), *interceptors],
            options=[
                ("grpc.max_receive_message_length", max_request_bytes(s.max_batch)),
                ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
                ("grpc.keepalive_permit_without_calls", 1),
                # Clients ping every second to notice a frozen node at once: allow it (more
                # often than this earns a GOAWAY too_many_pings).
                ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
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
        self.shard_admin = self._attach_shard_admin()
        owner = self.owner = Owner(
            self.store,
            self.ownership,
            self.clock,
            s,
            partitions=self.partition_map,
            notifier=self.notifier,
            handoff=self.handoff if s.handoff else None,
            metrics=self.metrics,
        )
        self.reaper = Reaper(
            self.store,
            self.ownership,
            self.clock,
            interval=s.reap_interval.total_seconds(),
            batch=s.reap_batch,
            on_effects=owner.dispatch.apply,
            metrics=self.metrics,
        )
        self.retention = Retention(
            self.store,
            self.ownership,
            self.clock,
            retention=s.retention,
            dead_retention=s.dead_retention,
            interval=s.retention_interval.total_seconds(),
            batch=s.retention_batch,
            history_after=s.history_after,
            history_slice=s.history_slice,
            on_purged=self.metrics.purged.inc,
            on_retired=self.metrics.retired.inc,
            on_slices_dropped=self.metrics.slices_dropped.inc,
        )
        self.depth = DepthPoller(
            self.store,
            self.clock,
            partitions=self.partition_map,
            leads=self.ownership.leads,
            queues=s.metrics_queues,
        )
        self.queue_recount = QueueRecount(
            self.store,
            self.ownership,
            self.clock,
            node_id=s.node_id,
            interval=s.queue_counts_interval.total_seconds(),
        )
        self.live_recount = QueueRecount(
            self.store,
            self.ownership,
            self.clock,
            node_id=s.node_id,
            interval=s.queue_counts_interval.total_seconds(),
            states=LIVE_STATES,
            batch=LIVE_BATCH,
            name="queue-counts-live",
        )
        self.queue_gauges = QueueGauges(
            self.store,
            self.clock,
            leads=self.ownership.leads,
            queues=s.metrics_queues,
            interval=2.5 * s.queue_counts_interval.total_seconds(),
        )
        if (
            s.cluster is not None
            and s.max_clock_offset is not None
            and follows_wall_clock(self.clock)
        ):
            self.clock_check = ClockCheck(
                self.store, self.clock, self.ownership, max_offset=s.max_clock_offset
            )
            self.api_clock = CorrectedClock(self.clock, self.clock_check)
        clock_check = self.clock_check
        self.health = HealthWatch(
            self.ownership,
            self._set_serving,
            loop_problems=lambda: [
                *self.supervisor.problems(),
                *(clock_check.problems() if clock_check is not None else []),
            ],
        )
        grace = (
            s.store_grace.total_seconds()
            if s.store_grace is not None
            else 0.6 * s.cluster.lease_ttl
            if s.cluster is not None
            else 6.0
        )
        self.shard_watch = self._make_shard_watch(grace)
        self.store_watch = StoreWatch(
            self.store,
            self.ownership,
            # Any owner statement that reached the store proves it answers.
            owner.last_ok,
            grace=grace,
            # Looking is a clock comparison (no I/O while the store answers): look often, so
            # a cut-off node hands off at grace + a fraction of it, not grace + a second.
            interval=min(1.0, grace / 5),
            may_resume=self._may_resume,
            reachable_elsewhere=self._store_reachable_elsewhere(grace),
        )
        self.schedules = (
            ShardedSchedules(self.store, lookahead=s.schedule_lookahead)
            if isinstance(self.store, ShardedStore)
            else Schedules(self.store, lookahead=s.schedule_lookahead)
        )
        self.pump = SchedulePump(
            self.schedules,
            self.ownership,
            self.clock,
            interval=s.schedule_interval.total_seconds(),
            lookahead=s.schedule_lookahead,
            quotas=self.quotas,
        )
        self.probe = ReadyProbe(
            self.notifier, self.store.ready_counts, interval=s.claim_poll.total_seconds()
        )
        if s.ready_notices:
            self.broadcast = ReadyBroadcast(self.notifier, self.store, s.node_id)
            self.notifier.on_notify = self.broadcast.publish
        if clock_check is not None:
            with contextlib.suppress(ChronoqError):  # no store: the loop measures later
                await clock_check.first_reading()
        self._add_services(server)
        # NOT_SERVING until the first health check: the health service would otherwise
        # answer SERVING for "" while the node has not taken any partition yet.
        await self._set_serving(False)
        await server.start()
        await self.ownership.start()
        if clock_check is not None:
            await clock_check.prime()  # a wrong clock takes no partition, fires nothing
        await self.health.check()  # every service's status is set before start returns
        self._start_loops(owner, clock_check)
        self._start_metrics()
        log.info("node %s serving on %s", s.node_id, self.address)

    def published_stats(self) -> dict[str, float]:
        """What this node publishes with its member stats: firing figures, when it last
        reached the store (and each shard), the shard map version it routes by."""
        out: dict[str, float] = {
            **(self.owner.figures() if self.owner is not None else {}),
            "store_ok_at": self.store_ok_at(),
            "map_version": float(self.current_map().version),
        }
        if self.shard_watch is not None:
            for shard, at in self.shard_watch.ok_epoch().items():
                out[f"{SHARD_OK_PREFIX}{shard}"] = at
        return out

    def _may_resume(self) -> bool:
        """Whether the store watch may rejoin: not while the clock is off, nor while a shard
        that others reach is out of reach from here (the shard watch stepped out)."""
        if self.clock_check is not None and not self.clock_check.may_resume():
            return False
        return self.shard_watch is None or not self.shard_watch.stepped_out

    def _attach_shard_admin(self) -> ShardAdmin | None:
        """The shard map's writers and the move driver: a node of an etcd cluster only."""
        if isinstance(self.ownership, EtcdOwnership):
            return attach_shard_admin(self.ownership, self.settings)
        return None

    def partitions_changed(self, partitions: set[int]) -> None:
        """Ownership moved: the owner engine forgets what it knew of them and fires at once."""
        if self.owner is not None:
            self.owner.moved(partitions)

    def store_ok_at(self) -> float:
        """When (epoch seconds) an owner statement of this node last reached the store."""
        last = self.owner.last_ok() if self.owner is not None else 0.0
        return time.time() - (time.monotonic() - last)

    def _store_reachable_elsewhere(self, grace: float) -> Callable[[], bool]:
        """Whether another member reached the store lately (see ``StoreWatch``): a single
        node has nobody to hand its partitions to."""
        ownership = self.ownership
        if not isinstance(ownership, EtcdOwnership):
            return lambda: False
        # A member's figure is at most a publication old, and clocks agree within the check.
        fresh = grace + 2 * ownership.settings.stats_interval

        def elsewhere() -> bool:
            return reachable_elsewhere(
                ownership.member_stats(), self.settings.node_id, time.time(), fresh
            )

        return elsewhere

    def clock_jumped(self) -> None:
        """The (virtual) clock jumped: fire what became due, read the wheel's window again."""
        if self.owner is not None:
            self.owner.clock_jumped()

    async def stop(self, grace: float = 2.0) -> None:
        """Stop firing first (no owner write after this returns), then the server, then the pool."""
        if self.store is None:
            return  # never started, or stopped already
        await self._health.enter_graceful_shutdown()
        if self.ownership is not None:
            async with self.ownership.gate:  # the owner statement in flight finishes first
                for loop in self._loops:
                    loop.cancel()
        # Bounded: a loop that ignored its cancellation must not hold the stop forever.
        await self.supervisor.stop(self._loops)
        self._loops = []
        if self.store_watch is not None:
            self.store_watch.close()
        log.debug("node %s: firing stopped", self.settings.node_id)
        if self.ownership is not None:
            await self.ownership.stop()
        log.debug("node %s: ownership released", self.settings.node_id)
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        log.debug("node %s: server stopped", self.settings.node_id)
        if self.shard_admin is not None:
            await self.shard_admin.close()
        if self.broadcast is not None:
            await self.broadcast.close()
        if self.owner is not None:
            await self.owner.close()
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
