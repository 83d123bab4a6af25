"""Partition ownership through etcd, with fencing tokens checked by the store.

Each partition this node should own (by ``ring.assign`` over the live members and the
published loads) moves through a small state machine::

    (absent) ──claim key──▶ ACQUIRING ──store accepts token──▶ OWNED
    OWNED ──no longer assigned / graceful stop──▶ RELEASING ──key deleted──▶ (absent)
    any ──lease lost or local deadline passed──▶ LOST (final for that lease; a new lease
                                                        starts a new epoch)

The owner key ``/chronoq/<cluster>/owners/<p>`` is created only if absent, attached to this
node's lease; its create revision is the fencing token, recorded in the store before the
first owner write. ``owned()`` answers nothing once the local lease deadline has passed, so a
node that cannot renew stops firing by itself, and a node that wakes from a pause is refused
by the store anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aetcd

from chronoq.clock import Clock
from chronoq.coordinator import ring
from chronoq.coordinator.etcd import ClusterSettings, Keys, connect, translated
from chronoq.coordinator.fence_audit import audit_fences
from chronoq.coordinator.lease import NodeLease
from chronoq.coordinator.loads import coming, due_loads, worth_publishing
from chronoq.coordinator.protocols import ClusterView, MemberView
from chronoq.coordinator.shards import ShardMapView
from chronoq.coordinator.view import PrefixView
from chronoq.errors import StoreUnavailable
from chronoq.partitionmap import PartitionMap
from chronoq.store.port import Admin, ByPartition
from chronoq.supervision import Loop, Supervisor

log = logging.getLogger("chronoq.coordinator")

RECONCILE_RETRY = 0.2  # seconds after a failed reconcile pass
#: Seconds of quiet after which a claim-deciding view reads its prefix to check its stream.
VIEW_VERIFY_INTERVAL = 1.0
#: The most of its time the leader spends counting the coming buckets' tasks for the loads
#: (``paced_interval``): the count reads every one of them, so it grows with the submit rate.
LOADS_SHARE = 0.02


class PartitionState(enum.Enum):
    ACQUIRING = "acquiring"
    OWNED = "owned"
    RELEASING = "releasing"
    LOST = "lost"


@dataclass(frozen=True)
class MemberInfo:
    node_id: str
    address: str


class OwnerStore(ByPartition, Admin, Protocol):
    """What ownership asks of the store: its fences and the partitions' loads."""


class EtcdOwnership:
    """Owns the partitions ``assign`` gives this node; see the module docstring."""

    def __init__(
        self,
        store: OwnerStore,
        node_id: str,
        address: str,
        settings: ClusterSettings,
        clock: Clock,
        *,
        partitions: PartitionMap,
        stats: Callable[[], dict[str, float]] = dict,
        monotonic: Callable[[], float] = time.monotonic,
        supervisor: Supervisor | None = None,
        store_dsn: str = "",
        client: aetcd.Client | None = None,
        shard_map: ShardMapView | None = None,
    ) -> None:
        self._store = store
        self.partitions = partitions
        # The node's supervisor: these loops count in its health like its own.
        self.supervisor = supervisor or Supervisor()
        self.node_id = node_id
        self.address = address
        self.settings = settings
        self._clock = clock
        self._stats = stats
        self.keys = Keys(settings.etcd.cluster)
        # The node may have made the client and the map view already (it reads the map
        # before it opens its store shards); this ownership closes both when it stops.
        self.client: aetcd.Client = client if client is not None else connect(settings.etcd)
        self.lease = NodeLease(
            self.client,
            settings.lease_ttl,
            on_lost=self._lease_lost,
            monotonic=monotonic,
            supervisor=self.supervisor,
        )
        sup = self.supervisor
        # The views that decide claims check etcd when quiet: a stream swapped with another
        # watch's would otherwise hide a freed partition for as long as that prefix is quiet.
        every = VIEW_VERIFY_INTERVAL
        self.members = PrefixView(
            self.client, self.keys.members, self._changed, supervisor=sup, verify_interval=every
        )
        self.owners = PrefixView(
            self.client, self.keys.owners, self._changed, supervisor=sup, verify_interval=every
        )
        self.loads_view = PrefixView(
            self.client, self.keys.loads, self._changed, supervisor=sup, verify_interval=every
        )
        # Member stats are for status pages only: a broken stats watch is not an outage.
        self.stats_view = PrefixView(self.client, self.keys.stats, supervisor=sup, critical=False)
        self.shard_map = shard_map or ShardMapView(
            self.client, self.keys, partitions.count, store_dsn, supervisor=sup
        )
        self.cluster_id = ""
        self.states: dict[int, PartitionState] = {}
        self.tokens: dict[int, int] = {}
        self.gate = asyncio.Lock()  # held by owner writes; a release waits for the one in flight
        self.on_acquired: Callable[[set[int]], None] = lambda _p: None
        self.on_released: Callable[[set[int]], None] = lambda _p: None
        self._wake = asyncio.Event()
        self._loops: list[Loop] = []
        self._stopping = False
        self.draining = False
        self._suspended = False
        self._last_desired: set[int] = set()
        #: Partitions kept (their keys stay ours) but not fired, by cause: a store shard out
        #: of reach from every node, or whose clock is off (see ``hold_out``).
        self.held_out: dict[str, frozenset[int]] = {}

    # ------------------------------------------------------------------ Ownership protocol

    def owned(self) -> Mapping[int, int]:
        if self._stopping or not self.lease.valid():
            return {}
        out = {p: self.tokens[p] for p, s in self.states.items() if s is PartitionState.OWNED}
        if self.held_out:
            for held in self.held_out.values():
                for p in held:
                    out.pop(p, None)
        return out

    def unavailable(self) -> frozenset[int]:
        """The partitions held out for any cause (their shard is down or its clock off)."""
        return frozenset().union(*self.held_out.values())

    def hold_out(self, cause: str, partitions: frozenset[int], reason: str) -> None:
        """Fire nothing of ``partitions`` until ``bring_back(cause)``, keeping their keys.

        For a store shard that no node reaches: handing its partitions to another node
        would only move the wait, and a node's owner writes there are fenced anyway. The
        keys staying ours also keeps the others from claiming them meanwhile. Not waiting
        for the statement in flight: it is stuck on that shard's dead connections.
        """
        before = self.unavailable()
        if self.held_out.get(cause) == partitions:
            return
        self.held_out[cause] = partitions
        fresh = self.unavailable() - before
        log.warning("%s: holding %d partitions out of firing", reason, len(partitions))
        owned = {p for p, s in self.states.items() if s is PartitionState.OWNED}
        if fresh & owned:
            self.on_released(set(fresh & owned))  # forget their watermarks and wheel entries

    def bring_back(self, cause: str) -> None:
        """Fire again what ``hold_out(cause)`` held (backfill first, as on a claim)."""
        if cause not in self.held_out:
            return
        before = self.unavailable()
        del self.held_out[cause]
        back = before - self.unavailable()
        log.warning("%s is over: %d partitions fire again", cause, len(back))
        owned = {p for p, s in self.states.items() if s is PartitionState.OWNED}
        if back & owned:
            self.on_acquired(set(back & owned))
        self._wake.set()  # claims left unfenced while the shard was down are finished now

    def expected(self) -> set[int]:
        if self.draining or not self.lease.valid():
            return set() if self.draining else set(self._last_desired)
        return {p for p, n in self.assignment().items() if n == self.node_id}

    async def drain(self) -> set[int]:
        """Leave the assignment (delete our member key, keep the lease for stats and API)
        and release every partition once its in-flight statement is done."""
        self.draining = True
        with translated("drain"):
            await self.client.delete(self.keys.member(self.node_id))
        held = {p for p, s in self.states.items() if s is PartitionState.OWNED}
        if held:
            await self._release(held)
        return held

    @property
    def suspended(self) -> bool:
        return self._suspended

    async def suspend(self, reason: str = "store unreachable") -> None:
        """Release every partition and claim none until ``resume`` (PostgreSQL is out of
        reach from here but maybe not from the other nodes, or this node's clock is off)."""
        if self._suspended:
            return
        self._suspended = True
        held = {p for p, s in self.states.items() if s is PartitionState.OWNED}
        log.warning("%s: leaving the assignment, releasing %d partitions", reason, len(held))
        # Leave the member list too, or the others would compute that these are still ours.
        with translated("leave membership"):
            await self.client.delete(self.keys.member(self.node_id))
        if held:
            # Not waiting for the statement in flight: it is stuck on the dead connection.
            # Whatever it did on the server is fenced: a successor's token bump waits for it.
            await self._release(held, wait_in_flight=False)

    async def resume(self) -> None:
        if self._suspended:
            log.warning("store reachable again: rejoining")
            lease_id = self.lease.id
            if lease_id is not None:
                value = json.dumps({"address": self.address}).encode()
                with translated("rejoin membership"):
                    await self.client.put(self.keys.member(self.node_id), value, lease=lease_id)
            self._suspended = False
            self._wake.set()

    def describe(self) -> ClusterView:
        stats = self.member_stats()
        return ClusterView(
            f"{self.settings.etcd.cluster} (etcd {self.cluster_id})",
            [
                MemberView(m.node_id, m.address, stats.get(m.node_id, {}))
                for m in self.live_members()
            ],
            self.owner_of(),
            shard_map=self.shard_map.current,
            shard_dsns=dict(self.shard_map.dsns),
            shard_map_error=self.shard_map.error,
        )

    async def start(self) -> None:
        with translated("connect"):
            probe = await self.client.get_prefix(self.keys.members)
        self.cluster_id = str(probe.header.cluster_id)
        # Before joining: a node whose partition count differs from the cluster's takes none.
        await self.shard_map.start()
        await self._register()
        for view in (self.members, self.owners, self.loads_view, self.stats_view):
            with translated(f"read {view.prefix!r}"):
                await view.start()
        self.lease.start()
        s = self.settings
        self._loops = [
            # A failed pass retries soon, without backoff: claims and handoffs wait for it.
            # Watch events and lease changes wake it at once.
            self.supervisor.every(
                "reconcile",
                self.reconcile,
                interval=s.reconcile_interval,
                retry=RECONCILE_RETRY,
                backoff=False,
                wake=self._wake,
            ),
            # Loads only move partitions ahead of hot buckets, stats only feed status: neither
            # decides whether the node can fire.
            self.supervisor.every(
                "publish-loads",
                self._publish_loads_pass,
                interval=s.load_interval,
                share=LOADS_SHARE,  # the count grows with the coming tasks
                initial_delay=True,
                critical=False,
            ),
            self.supervisor.every(
                "publish-stats",
                self._publish_stats_pass,
                interval=s.stats_interval,
                initial_delay=True,
                critical=False,
            ),
            self.supervisor.every(
                "fence-audit",
                self._audit_fences_pass,
                interval=s.fence_audit_interval,
                initial_delay=True,
            ),
        ]

    async def stop(self) -> None:
        """Graceful: stop owner writes, wait for the one in flight, then revoke the lease
        so every owner key disappears at once and the watchers take over."""
        self._stopping = True
        async with self.gate:
            released = {p for p, s in self.states.items() if s is PartitionState.OWNED}
            self.states.clear()
            self.tokens.clear()
        await self.supervisor.stop(self._loops)
        self._loops = []
        log.debug("%s: ownership loops stopped", self.node_id)
        await self.lease.stop(revoke=True)
        log.debug("%s: lease revoked", self.node_id)
        for view in (self.members, self.owners, self.loads_view, self.stats_view):
            await view.stop()
        await self.shard_map.stop()
        log.debug("%s: views stopped", self.node_id)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.close(), 5)
        log.debug("%s: etcd client closed", self.node_id)
        if released:
            self.on_released(released)

    # ------------------------------------------------------------------ membership

    async def _register(self) -> None:
        lease_id = await self.lease.grant()
        value = json.dumps({"address": self.address}).encode()
        with translated("register member"):
            await self.client.put(self.keys.member(self.node_id), value, lease=lease_id)

    def live_members(self) -> list[MemberInfo]:
        out = []
        for entry in self.members.items.values():
            node_id = entry.key[len(self.keys.members) :].decode()
            try:
                address = json.loads(entry.value)["address"]
            except (ValueError, KeyError):
                address = ""
            out.append(MemberInfo(node_id, address))
        return sorted(out, key=lambda m: m.node_id)

    def published_loads(self) -> dict[int, float]:
        entry = self.loads_view.items.get(self.keys.loads)
        if entry is None:
            return {}
        try:
            return {int(p): float(v) for p, v in json.loads(entry.value)["loads"].items()}
        except (ValueError, KeyError, TypeError):
            return {}

    def assignment(self) -> dict[int, str]:
        members = [m.node_id for m in self.live_members()]
        return ring.assign(
            self.partitions.count, members, self.published_loads(), epsilon=self.settings.epsilon
        )

    def owner_of(self) -> dict[int, tuple[str, int]]:
        """Partition → (owner node, fencing token) as etcd holds it now."""
        return {
            self.keys.partition_of(e.key): (e.value.decode(), e.create_revision)
            for e in self.owners.items.values()
        }

    # ------------------------------------------------------------------ reconcile

    def _changed(self) -> None:
        self._wake.set()

    def _lease_lost(self) -> None:
        lost = {p for p, s in self.states.items() if s is PartitionState.OWNED}
        for p in self.states:
            self.states[p] = PartitionState.LOST
        log.warning("lease lost: %d partitions LOST", len(lost))
        if lost:
            self.on_released(lost)
        self._wake.set()

    async def reconcile(self) -> None:
        """Release what is no longer ours, claim what is ours and free."""
        if self._stopping:
            return
        if self.draining or self._suspended:
            return
        if self.lease.id is None:  # lost: a new lease starts a new epoch
            self.states.clear()
            self.tokens.clear()
            await self._register()
            self.lease.start()
        assignment = self.assignment()
        if self.node_id not in {m.node_id for m in self.live_members()}:
            return  # our member key is not visible yet
        desired = {p for p, n in assignment.items() if n == self.node_id}
        self._last_desired = desired
        holding = {p for p, s in self.states.items() if s is PartitionState.OWNED}
        if holding - desired:
            await self._release(holding - desired)
        owners = self.owner_of()
        free = sorted(p for p in desired - holding if p not in owners)
        # Keys we hold under this lease but never fenced (the store failed right after the
        # claim): finish them, or nobody would ever fire those partitions. Not while their
        # shard is held out: the key stays ours, and ``bring_back`` wakes this pass.
        out = self.unavailable()
        unfenced = sorted(
            p for p in self._unfenced_keys() if p not in holding and p not in out
        )
        # Claims run concurrently: a handoff of dozens of partitions is one round trip deep.
        won = await asyncio.gather(
            *(self._acquire(p) for p in free),
            *(self._finish(p, self._unfenced_keys()[p], keep=p in desired) for p in unfenced),
            return_exceptions=True,
        )
        tried = [*free, *unfenced]
        acquired = {p for p, ok in zip(tried, won, strict=True) if ok is True}
        if acquired:
            self.on_acquired(acquired - out)
        # A claim whose fence a held-out shard could not take is no failure of this pass:
        # its key stays ours until the shard answers again.
        failures = [
            e
            for p, e in zip(tried, won, strict=True)
            if isinstance(e, BaseException) and not (p in out and isinstance(e, StoreUnavailable))
        ]
        if failures:
            raise failures[0]

    def _unfenced_keys(self) -> dict[int, int]:
        """Owner keys of this node under its current lease, by partition → token."""
        lease_id = self.lease.id
        return {
            self.keys.partition_of(e.key): e.create_revision
            for e in self.owners.items.values()
            if e.lease == lease_id and e.value.decode() == self.node_id
        }

    async def _acquire(self, partition: int) -> bool:
        key = self.keys.owner(partition)
        lease_id = self.lease.id
        if lease_id is None or not self.lease.valid():
            return False
        self.states[partition] = PartitionState.ACQUIRING
        tx = self.client.transactions
        with translated("claim partition"):
            ok, responses = await self.client.transaction(
                compare=[tx.create(key) == 0],
                success=[tx.put(key, self.node_id.encode(), lease=lease_id)],
                failure=[tx.get(key)],
            )
        if not ok:
            self.states.pop(partition, None)
            return False
        token = responses[0].response_put.header.revision
        return await self._finish(partition, token, keep=True)

    async def _finish(self, partition: int, token: int, *, keep: bool) -> bool:
        """Record our token in the store (ACQUIRING → OWNED), or give the key back."""
        if not keep:
            await self._delete_key(partition, token)
            self.states.pop(partition, None)
            return False
        self.states[partition] = PartitionState.ACQUIRING
        try:
            fence = await self._store.take_fence(partition, token, self.cluster_id, self.node_id)
        except StoreUnavailable:
            self.states.pop(partition, None)  # the key stays ours: the next pass finishes it
            raise
        if fence is None:  # the store holds a newer token: never fire with ours
            log.error("partition %d: store refused token %d", partition, token)
            await self._delete_key(partition, token)
            self.states.pop(partition, None)
            return False
        self.tokens[partition] = token
        self.states[partition] = PartitionState.OWNED
        return True

    async def _audit_fences_pass(self) -> None:
        try:
            await self.audit_fences()
        except StoreUnavailable:
            if not self.held_out:
                raise
            # A store shard held out (down) fails the fence read: audit when it is back.
            log.debug("fence audit skipped while %s", ", ".join(self.held_out))

    async def audit_fences(self) -> set[int]:
        """Take our fences again where the store holds an older token than ours (it went
        back in time: ``chronoq.coordinator.fence_audit``); returns those partitions."""
        return await audit_fences(self._store, self.owned(), self.cluster_id, self.node_id)

    async def _release(self, partitions: set[int], *, wait_in_flight: bool = True) -> None:
        if wait_in_flight:
            async with self.gate:  # the owner statement in flight finishes first
                for p in partitions:
                    self.states[p] = PartitionState.RELEASING
        else:
            for p in partitions:
                self.states[p] = PartitionState.RELEASING
        self.on_released(partitions)

        async def release(p: int) -> None:
            await self._delete_key(p, self.tokens.get(p, 0))
            self.states.pop(p, None)
            self.tokens.pop(p, None)

        # Concurrent, like claims: a node handing off dozens of partitions (drain, SIGTERM,
        # store cut off) is one etcd round trip away from its successors, not dozens.
        done = await asyncio.gather(
            *(release(p) for p in sorted(partitions)), return_exceptions=True
        )
        failures = [e for e in done if isinstance(e, BaseException)]
        if failures:
            raise failures[0]

    async def _delete_key(self, partition: int, token: int) -> None:
        key = self.keys.owner(partition)
        tx = self.client.transactions
        with translated("release partition"):
            await self.client.transaction(
                compare=[tx.create(key) == token], success=[tx.delete(key)], failure=[]
            )

    # ------------------------------------------------------------------ loads and stats

    def leads(self) -> bool:
        """The first live member does the shared chores (one count of the coming buckets
        for everyone); a node whose lease lapsed does none."""
        members = self.live_members()
        return bool(members) and members[0].node_id == self.node_id and self.lease.valid()

    async def _publish_loads_pass(self) -> None:
        if self.leads():
            await self.publish_loads()

    async def publish_loads(self) -> bool:
        """Publish per-partition due work of the coming buckets when the current assignment
        would overload a member with it; returns whether it published. Overdue tasks weigh
        nothing (``loads.coming``): a slow store's backlog moves no partition."""
        window = coming(
            self._clock.now(), self._store.bucket_seconds, self.settings.load_horizon_buckets
        )
        out = self.unavailable()  # a held-out shard would fail the whole count
        counts = await self._store.pending_by_bucket(
            [p for p in self.partitions.all if p not in out],
            window.first,
            window.last,
            due_after=window.after,
        )
        fresh = due_loads(counts)
        members = [m.node_id for m in self.live_members()]
        if not worth_publishing(
            fresh,
            self.published_loads(),
            self.assignment(),
            self.partitions.all,
            len(members),
            self.settings.epsilon,
        ):
            return False
        with translated("publish loads"):
            await self.client.put(
                self.keys.loads, json.dumps({"bucket": window.first, "loads": fresh}).encode()
            )
        return True

    async def _publish_stats_pass(self) -> None:
        lease_id = self.lease.id
        if lease_id is None:
            return
        body = {"address": self.address, "owned": len(self.owned()), **self._stats()}
        with translated("publish stats"):
            await self.client.put(
                self.keys.stat(self.node_id), json.dumps(body).encode(), lease=lease_id
            )

    def member_stats(self) -> dict[str, dict[str, float]]:
        out = {}
        for entry in self.stats_view.items.values():
            with contextlib.suppress(ValueError):
                out[entry.key[len(self.keys.stats) :].decode()] = json.loads(entry.value)
        return out
