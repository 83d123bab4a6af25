"""A node's store shards: the shard map it routes by, the store of each shard (opened as
the map names them), and each shard's liveness and health service."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from typing import Any

from grpc_health.v1 import health, health_pb2

from chronoq.clock import Clock
from chronoq.config import NodeSettings
from chronoq.coordinator.etcd import Keys, connect
from chronoq.coordinator.ownership import EtcdOwnership
from chronoq.coordinator.protocols import Ownership
from chronoq.coordinator.shards import ShardMapView
from chronoq.node.clock_check import ClockCheck
from chronoq.node.housekeeping import (
    reachable_elsewhere,
)
from chronoq.node.shards import ShardStores, ShardWatch
from chronoq.shardmap import ShardMap, shard_name, single
from chronoq.store import Store
from chronoq.store.sharded import ShardedStore
from chronoq.supervision import Loop, Supervisor

#: The task store a node speaks to: its one store, or (a cluster node) its store of shards.
NodeStore = Store | ShardedStore

#: Each store shard's health service: ``chronoq.store.shard-1`` is NOT_SERVING while that
#: shard is down (the node's own, "", stays SERVING: it serves the other shards).
STORE_HEALTH_PREFIX = "chronoq.store."
#: A member stat: when (epoch seconds) the member last reached a shard, e.g.
#: ``store_ok_at:shard-1``.
SHARD_OK_PREFIX = "store_ok_at:"


def _holds_argument(holds: tuple[int, ...] | None) -> dict[str, Any]:
    """``holds=`` for ``Store.connect`` (None: every partition, a node alone)."""
    if holds is None or "holds" not in inspect.signature(Store.connect).parameters:
        return {}
    return {"holds": holds}


class NodeShards:
    """The node's shard wiring: the shard map, a store per shard, each shard's health."""

    settings: NodeSettings
    clock: Clock
    store: NodeStore | None
    ownership: Ownership | None
    supervisor: Supervisor
    shard_map: ShardMapView | None
    shard_stores: ShardStores[Store] | None
    shard_watch: ShardWatch | None
    clock_check: ClockCheck | None
    _shards_wanted: asyncio.Event
    _health: health.aio.HealthServicer

    async def _open_stores(self) -> NodeStore:
        """The store alone; or, in a cluster, the shard map first (the stores are made with
        what it says each shard holds), then a store per shard of it."""
        s = self.settings
        if s.cluster is None:
            return await self._open_store(shard_name(0), s.dsn, None)
        # shard-0 is needed to start (as the one store was); another shard that cannot be
        # opened now is down, and opened again in the background. It is opened holding
        # nothing new: a first map splits only an empty shard-0, then it adopts its part.
        first = await self._open_store(shard_name(0), s.dsn, ())
        client = connect(s.cluster.etcd)
        view = ShardMapView(
            client,
            Keys(s.cluster.etcd.cluster),
            s.partitions,
            s.dsn,
            shard_dsns=s.store_shards,
            first_is_empty=first.holds_no_rows,
            supervisor=self.supervisor,
        )
        self.shard_map = view
        try:
            await view.start()
            self.shard_stores = ShardStores(
                s, self.current_map, lambda: view.dsns, self._open_store,
                on_opened=self._shard_opened,
            )  # fmt: skip
            await first.adopt(self._holds(shard_name(0)))
        except BaseException:
            await view.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 5)
            await first.close()
            raise
        self.shard_stores.stores[shard_name(0)] = first
        sharded = ShardedStore({shard_name(0): first}, self.current_map, refresh=view.refresh)
        sharded.set_map(self.current_map())
        self.store = sharded
        await self.shard_stores.open_missing()
        view.on_map.append(self._map_changed)
        return sharded

    def _make_shard_watch(self, grace: float) -> ShardWatch | None:
        """Each shard's liveness, for a cluster node (its map may hold several shards)."""
        sharded, ownership = self.store, self.ownership
        if not isinstance(sharded, ShardedStore) or ownership is None:
            return None
        clock_check = self.clock_check
        return ShardWatch(
            sharded.probe_shard,
            self.current_map,
            ownership,
            grace=grace,
            interval=min(1.0, grace / 5),
            elsewhere=self._shard_reachable_elsewhere(grace),
            may_resume=clock_check.may_resume if clock_check is not None else lambda: True,
            on_health=self._set_shard_serving,
        )

    def _shard_watch_loops(self) -> list[Loop]:
        watch, shard_stores = self.shard_watch, self.shard_stores
        if watch is None or shard_stores is None:
            return []
        return [
            watch.start(self.supervisor),
            # Not critical: a shard without a store is down, which the shard watch reports.
            self.supervisor.every(
                "open-shards",
                shard_stores.open_missing,
                interval=5.0,
                wake=self._shards_wanted,
                initial_delay=True,
                critical=False,
            ),
        ]

    def _holds(self, name: str) -> tuple[int, ...]:
        from chronoq.node.shards import holds_at_start

        return holds_at_start(name, self.current_map())

    async def _open_store(self, name: str, dsn: str, holds: tuple[int, ...] | None) -> Store:
        s = self.settings
        return await Store.connect(
            dsn,
            partitions=s.partitions,
            bucket_seconds=s.bucket_seconds,
            max_size=s.pool_size,
            limits=s.limits,
            **_holds_argument(holds),
        )

    def current_map(self) -> ShardMap:
        """The shard map this node routes by (a node alone: ``shard-0`` holds everything)."""
        view = self.shard_map
        if view is not None and view.current is not None:
            return view.current
        return single(self.settings.partitions)

    def _shard_opened(self, name: str, store: Store) -> None:
        if isinstance(self.store, ShardedStore) and name not in self.store.stores:
            self.store.add_store(name, store)
            self.store.set_map(self.current_map())

    def _map_changed(self, current: ShardMap) -> None:
        """A new map from etcd: route by it; open the shards it names that have no store."""
        if isinstance(self.store, ShardedStore):
            self.store.set_map(current)
        if self.shard_stores is not None and self.shard_stores.missing():
            self._shards_wanted.set()

    async def _set_shard_serving(self, shard: str, ok: bool) -> None:
        """Each shard's health under its own service name, e.g. ``chronoq.store.shard-1``:
        a down shard is named there while the node serves the others."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ok
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self._health.set(f"{STORE_HEALTH_PREFIX}{shard}", status)

    def shard_problems(self) -> list[str]:
        """The store shards this node finds down (it serves the others)."""
        return self.shard_watch.problems() if self.shard_watch is not None else []

    def _shard_reachable_elsewhere(self, grace: float) -> Callable[[str, float], bool]:
        """Whether another member reached shard ``s`` lately (``store_ok_at:<shard>``), and
        later than ``after`` (epoch seconds: when this node lost it)."""
        ownership = self.ownership
        if not isinstance(ownership, EtcdOwnership):
            return lambda _s, _after: False
        fresh = grace + 2 * ownership.settings.stats_interval

        def elsewhere(shard: str, after: float) -> bool:
            stats = {
                member: {"store_ok_at": figures.get(f"{SHARD_OK_PREFIX}{shard}", 0.0)}
                for member, figures in ownership.member_stats().items()
            }
            return reachable_elsewhere(
                stats, self.settings.node_id, time.time(), fresh, after=after
            )

        return elsewhere
