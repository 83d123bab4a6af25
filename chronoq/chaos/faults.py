"""Fault injection: the injector that plays a schedule of faults, and what it acts on.

``Injector`` plays a schedule (``chronoq.chaos.fault_plan``) against a ``FaultTarget`` (the
cluster backend) and a ``WorkerPool`` and records each fault's window: from the first harmful
act to the heal. Targets are picked from the pick number at injection time (the etcd leader is
whoever leads then).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from chronoq.chaos.drift import Drift
from chronoq.chaos.fault_plan import FaultKind, PlannedFault
from chronoq.chaos.history import FaultRecord
from chronoq.chaos.ledger import now_us
from chronoq.chaos.shaping import LinkShape
from chronoq.chaos.worker import WorkerPool
from chronoq.node.clock_check import CLOCK_CHECK_INTERVAL

log = logging.getLogger("chronoq.chaos")


#: Seconds before asking Patroni for a writable primary after a store fault: it acts on its
#: next loop (1 s), and until then reports the roles of before the fault.
NOTICE_S = 1.5
#: clock-drift: the peak offset (past the nodes' 500 ms bound, so the check must act), the
#: share of the hold spent drifting away (the rest slews back), and how often the offset file
#: is rewritten (each step moves the clock by rate x step: 5 ms at the default 50 ms/s).
DRIFT_PEAK_MS = 1000
DRIFT_RISE_SHARE = 2 / 3
DRIFT_STEP_S = 0.1
#: disk-full: how often a probe submit asks a node while the disk is full, and how long after
#: it a submit must be accepted again (it is recorded, not enforced: the checker judges).
PROBE_EVERY_S = 0.5
RESUME_WAIT_S = 60.0
#: slow-links-*: how bad the links get (see ``LinkShape``).
SLOW_LINK = LinkShape()


class FaultTarget(Protocol):
    """What the injector needs of a cluster backend (local processes or docker)."""

    name: str
    supported: frozenset[FaultKind]

    @property
    def node_ids(self) -> list[str]: ...

    def node_alive(self, node_id: str) -> bool: ...
    def kill_node(self, node_id: str) -> None: ...
    def restart_node(self, node_id: str) -> None: ...  # graceful, or start if dead; waits
    def pause_node(self, node_id: str) -> None: ...
    def resume_node(self, node_id: str) -> None: ...
    def set_clock(self, node_id: str, offset_ms: int) -> None: ...  # restarts the node
    def etcd_size(self) -> int: ...
    def etcd_leader(self) -> int | None: ...
    def kill_etcd_member(self, index: int) -> None: ...
    def start_etcd_member(self, index: int) -> None: ...
    def stop_postgres(self, *, crash: bool) -> None: ...
    def start_postgres(self) -> None: ...
    def cut(self, node_id: str, service: str) -> None: ...  # service: etcd | postgres
    def heal(self, node_id: str, service: str) -> None: ...
    def shape_links(self, service: str, shape: LinkShape, seed: int) -> None: ...  # every node
    def unshape_links(self, service: str) -> int: ...  # connections reset since shape_links
    def drift_clock(self, node_id: str, offset_ms: int) -> None: ...  # no restart
    def fill_disk(self) -> int: ...  # the ballast's bytes: the store's filesystem is full
    def free_disk(self) -> bool: ...  # whether PostgreSQL had to be started again
    def heal_all(self) -> None: ...


@runtime_checkable
class StoreFailoverTarget(Protocol):
    """A replicated store's fault hooks (``chronoq.embedded.ha.PatroniCluster`` has them);
    each returns the member it acted on, ``switchover`` the new leader."""

    def kill_postmaster(self, name: str | None = None) -> str: ...
    def kill_member(self, name: str | None = None) -> str: ...
    def kill_standby(self) -> str: ...
    def restart_member(self, name: str, timeout: float = 120.0) -> None: ...
    def switchover(self, candidate: str | None = None, timeout: float = 60.0) -> str: ...
    def wait_writable(self, timeout: float = 60.0) -> str: ...


@runtime_checkable
class ShardFaultTarget(Protocol):
    """A store of shards' fault hooks (the local backend's, over
    ``chronoq.embedded.shards.StoreShards``): shard-1.. by name."""

    def shard_names(self) -> list[str]: ...
    def kill_shard_primary(self, name: str) -> int: ...  # the PID killed
    def wait_shard_writable(self, name: str, timeout: float) -> None: ...  # started again


@dataclass
class Injector:
    """Plays a schedule; ``records`` holds every injected fault with its window. ``store``:
    the replicated store's hooks, for the store faults (None: a single PostgreSQL)."""

    target: FaultTarget
    workers: WorkerPool
    clock_jump_ms: int = 3000
    records: list[FaultRecord] = field(default_factory=list)
    store: StoreFailoverTarget | None = None
    #: One submit, one call, no retry: (code, message) as a node answers it (disk-full).
    probe: Callable[[], Awaitable[tuple[str, str]]] | None = None
    #: The store shards' hooks (None: one shard), and the partitions a shard holds now
    #: (from the shard map in etcd), for the report of a shard's outage.
    shards: ShardFaultTarget | None = None
    shard_partitions: Callable[[str], Awaitable[list[int]]] | None = None
    #: The nodes' addresses (move-partitions asks them for the move) and how long a killed
    #: driver stays down (past its lease, so that another node takes the move over).
    addresses: Sequence[str] = ()
    node_down_s: float = 4.0

    async def run(self, plan: Sequence[PlannedFault], started: float, stop: asyncio.Event) -> None:
        """Inject each planned fault at its time (``started`` is a monotonic instant)."""
        for pf in plan:
            delay = started + pf.at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):  # not wait_for (3.11 cancel race)
                    async with asyncio.timeout(delay):
                        await stop.wait()
            if stop.is_set():
                return
            await self.inject(pf)

    async def inject(self, pf: PlannedFault) -> FaultRecord:
        act = self._acts()[pf.kind]
        detail: dict[str, Any] = {"hold_s": pf.hold}
        start = now_us()
        target, error = "", ""
        try:
            target = await act(pf, detail)
        except Exception as exc:  # noqa: BLE001 - a failed injection is recorded, not fatal
            error = f"{type(exc).__name__}: {exc}"
            log.warning("fault %s failed: %s", pf.kind, error)
        record = FaultRecord(pf.kind.value, target or detail.get("target", ""),
                             detail.pop("start_us", start), now_us(), detail, error)
        self.records.append(record)
        return record

    def _acts(self) -> dict[FaultKind, Callable[[PlannedFault, dict[str, Any]],
                                                 Awaitable[str]]]:
        return {
            FaultKind.KILL_NODE: self._kill_node,
            FaultKind.FREEZE_NODE: self._freeze_node,
            FaultKind.FREEZE_NODE_PAST_TTL: self._freeze_node,
            FaultKind.KILL_WORKER: self._kill_worker,
            FaultKind.PAUSE_WORKER: self._pause_worker,
            FaultKind.KILL_ETCD_MEMBER: self._kill_etcd,
            FaultKind.KILL_ETCD_LEADER: self._kill_etcd,
            FaultKind.RESTART_POSTGRES: self._restart_postgres,
            FaultKind.CUT_NODE_ETCD: self._cut,
            FaultKind.CUT_NODE_POSTGRES: self._cut,
            FaultKind.CLOCK_JUMP: self._clock_jump,
            FaultKind.ROLLING_RESTART: self._rolling_restart,
            FaultKind.DISK_FULL: self._disk_full,
            FaultKind.SLOW_LINKS_ETCD: self._slow_links,
            FaultKind.SLOW_LINKS_POSTGRES: self._slow_links,
            FaultKind.CLOCK_DRIFT: self._clock_drift,
            FaultKind.KILL_PG_PRIMARY: self._store_fault,
            FaultKind.KILL_PG_MEMBER: self._store_fault,
            FaultKind.SWITCHOVER: self._store_fault,
            FaultKind.KILL_PG_STANDBY: self._store_fault,
            FaultKind.KILL_SHARD_PRIMARY: self._kill_shard_primary,
            FaultKind.MOVE_PARTITIONS: self._move_partitions,
        }

    def _node(self, pf: PlannedFault) -> str:
        alive = [n for n in self.target.node_ids if self.target.node_alive(n)]
        if not alive:
            raise RuntimeError("no live node to inject into")
        return alive[pf.pick % len(alive)]

    async def _kill_node(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        node = self._node(pf)
        detail["target"] = node
        await asyncio.to_thread(self.target.kill_node, node)
        await asyncio.sleep(pf.hold)
        await asyncio.to_thread(self.target.restart_node, node)
        return node

    async def _freeze_node(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        node = self._node(pf)
        detail["target"] = node
        self.target.pause_node(node)
        try:
            await asyncio.sleep(pf.hold)
        finally:
            self.target.resume_node(node)
        return node

    async def _worker_mid_task(self, pf: PlannedFault, detail: dict[str, Any]) -> int:
        index = pf.pick % len(self.workers.workers)
        detail["in_flight"] = await asyncio.to_thread(self.workers.wait_mid_task, index, 5.0)
        detail["start_us"] = now_us()
        return index

    async def _kill_worker(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        index = await self._worker_mid_task(pf, detail)
        name = self.workers.workers[index].name
        detail["target"] = name
        await asyncio.to_thread(self.workers.kill, index)
        await asyncio.sleep(pf.hold)
        detail["restarted_as"] = self.workers.spawn(index).name
        return name

    async def _pause_worker(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        index = await self._worker_mid_task(pf, detail)
        name = self.workers.workers[index].name
        detail["target"] = name
        self.workers.signal(index, signal.SIGSTOP)
        try:
            await asyncio.sleep(pf.hold)
        finally:
            self.workers.signal(index, signal.SIGCONT)
        return name

    async def _kill_etcd(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        size = self.target.etcd_size()
        leader = await asyncio.to_thread(self.target.etcd_leader)
        if pf.kind is FaultKind.KILL_ETCD_LEADER:
            if leader is None:
                raise RuntimeError("no etcd leader to kill")
            index = leader
        else:
            others = [i for i in range(size) if i != leader] or [0]
            index = others[pf.pick % len(others)]
        detail["target"] = f"etcd{index}"
        detail["members"] = size
        await asyncio.to_thread(self.target.kill_etcd_member, index)
        await asyncio.sleep(pf.hold)
        await asyncio.to_thread(self.target.start_etcd_member, index)
        detail["leader_after"] = await asyncio.to_thread(self.target.etcd_leader)
        return f"etcd{index}"

    async def _restart_postgres(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        crash = pf.variant != "clean"
        detail["crash"] = crash
        detail["target"] = "postgres"
        await asyncio.to_thread(self.target.stop_postgres, crash=crash)
        await asyncio.sleep(pf.hold)
        await asyncio.to_thread(self.target.start_postgres)
        return "postgres"

    async def _cut(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        node = self._node(pf)
        service = "etcd" if pf.kind is FaultKind.CUT_NODE_ETCD else "postgres"
        detail["target"] = node
        self.target.cut(node, service)
        try:
            await asyncio.sleep(pf.hold)
        finally:
            self.target.heal(node, service)
        return node

    async def _clock_jump(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        node = self._node(pf)
        offset = self.clock_jump_ms if pf.variant != "-" else -self.clock_jump_ms
        detail["target"] = node
        detail["offset_ms"] = offset
        await asyncio.to_thread(self.target.set_clock, node, offset)
        await asyncio.sleep(pf.hold)
        await asyncio.to_thread(self.target.set_clock, node, 0)
        return node

    async def _clock_drift(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        """Move one node's clock away and back a step at a time, without restarting it."""
        node = self._node(pf)
        rise = pf.hold * DRIFT_RISE_SHARE
        peak = -DRIFT_PEAK_MS if pf.variant == "-" else DRIFT_PEAK_MS
        drift = Drift(peak, rise_s=rise, fall_s=pf.hold - rise)
        detail.update(target=node, peak_ms=peak, rise_s=drift.rise_s, fall_s=drift.fall_s,
                      check_interval_s=CLOCK_CHECK_INTERVAL.total_seconds())
        started = time.monotonic()
        detail["start_us"] = now_us()
        try:
            while (elapsed := time.monotonic() - started) < drift.duration_s:
                self.target.drift_clock(node, round(drift.offset_ms(elapsed)))
                await asyncio.sleep(DRIFT_STEP_S)
        finally:
            self.target.drift_clock(node, 0)
        return node

    async def _slow_links(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        """Every node's links to etcd or PostgreSQL slow and lossy for the hold."""
        service = "etcd" if pf.kind is FaultKind.SLOW_LINKS_ETCD else "postgres"
        shape = SLOW_LINK
        detail.update(target="all nodes", latency_ms=shape.latency_s * 1000,
                      jitter_ms=shape.jitter_s * 1000,
                      bandwidth_kib_s=shape.bandwidth_bps / 1024,
                      mean_life_s=shape.mean_life_s)
        self.target.shape_links(service, shape, pf.pick)
        try:
            await asyncio.sleep(pf.hold)
        finally:
            detail["resets"] = self.target.unshape_links(service)
        return "all nodes"

    async def _disk_full(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        """Fill the store's filesystem with a ballast file, hold, remove it. Meanwhile probe
        submits record what a node answers; after it, how soon a submit is accepted again."""
        detail["target"] = "postgres"
        answers: Counter[str] = Counter()
        try:
            detail["ballast_bytes"] = await asyncio.to_thread(self.target.fill_disk)
            held = time.monotonic() + pf.hold
            while (left := held - time.monotonic()) > 0:
                if self.probe is not None:
                    code, message = await self.probe()
                    answers[code] += 1
                    if code != "OK" and "first_refusal" not in detail:
                        detail["first_refusal"] = f"{code}: {message[:200]}"
                await asyncio.sleep(min(left, PROBE_EVERY_S))
        finally:
            detail["postgres_restarted"] = await asyncio.to_thread(self.target.free_disk)
        detail["probes_during"] = dict(answers)
        freed = time.monotonic()
        if self.probe is not None:
            for _ in range(int(RESUME_WAIT_S / PROBE_EVERY_S)):  # bounded
                if (await self.probe())[0] == "OK":
                    detail["accepted_again_after_s"] = round(time.monotonic() - freed, 3)
                    break
                await asyncio.sleep(PROBE_EVERY_S)
        return "postgres"

    async def _rolling_restart(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        for node in list(self.target.node_ids):
            await asyncio.to_thread(self.target.restart_node, node)
        detail["target"] = "all nodes"
        return "all nodes"

    async def _store_fault(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        """A store fault; ``writable_after_s`` is when Patroni had a writable primary with a
        synchronous standby again (measured from the fault; a bound of the store's gap)."""
        store = self.store
        if store is None:
            raise RuntimeError(f"{pf.kind}: the store is a single PostgreSQL (no --pg-members)")
        started = time.monotonic()
        if pf.kind is FaultKind.SWITCHOVER:
            member = "primary"
            detail["new_leader"] = await asyncio.to_thread(store.switchover)
        elif pf.kind is FaultKind.KILL_PG_PRIMARY:
            member = await asyncio.to_thread(store.kill_postmaster)
        elif pf.kind is FaultKind.KILL_PG_MEMBER:
            member = await asyncio.to_thread(store.kill_member)
        else:
            member = await asyncio.to_thread(store.kill_standby)
        detail["target"] = member
        await asyncio.sleep(NOTICE_S)  # Patroni notices a fault on its next loop only
        detail["leader_after"] = await asyncio.to_thread(store.wait_writable, 90.0)
        detail["writable_after_s"] = round(time.monotonic() - started, 3)
        if pf.kind in (FaultKind.KILL_PG_MEMBER, FaultKind.KILL_PG_STANDBY):
            await asyncio.sleep(max(0.0, started + pf.hold - time.monotonic()))
            await asyncio.to_thread(store.restart_member, member)
        return member

    async def _kill_shard_primary(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        """SIGKILL one shard's postmaster (its Patroni leader's) by PID; after the hold it is
        started again (a single server) or Patroni has restarted it; ``writable_after_s`` is
        when it took commits again. ``partitions``: those it held, from the shard map."""
        if self.shards is None:
            raise RuntimeError(f"{pf.kind}: the store has one shard (no --store-shards)")
        names = self.shards.shard_names()
        name = names[pf.pick % len(names)]
        detail["target"] = name
        if self.shard_partitions is not None:
            detail["partitions"] = await self.shard_partitions(name)
        started = time.monotonic()
        detail["start_us"] = now_us()
        detail["pid"] = await asyncio.to_thread(self.shards.kill_shard_primary, name)
        await asyncio.sleep(pf.hold)
        await asyncio.to_thread(self.shards.wait_shard_writable, name, 90.0)
        detail["writable_after_s"] = round(time.monotonic() - started, 3)
        return name

    async def _move_partitions(self, pf: PlannedFault, detail: dict[str, Any]) -> str:
        """Ask for a move of a random run of one shard's partitions to another shard and
        follow it until it ends (at most the hold); with variant ``kill-node`` its driver is
        SIGKILLed while it copies or catches up, and started again after ``node_down_s``.
        ``partitions``, ``phases`` (first seen, seconds from the ask), ``committed_us`` and
        ``outcome`` go in the record (the figures give the moved partitions' firing gap)."""
        if self.shards is None or self.shard_partitions is None or not self.addresses:
            raise RuntimeError(f"{pf.kind}: the store has one shard (no --store-shards)")
        from chronoq.client import Client
        from chronoq.shardmap import format_partitions

        rng = random.Random(pf.pick)
        names = ["shard-0", *self.shards.shard_names()]
        held = {n: await self.shard_partitions(n) for n in names}
        sources = [n for n in names if len(held[n]) >= 2]
        if not sources:
            raise RuntimeError(f"{pf.kind}: no shard holds two partitions or more")
        source = rng.choice(sources)
        target = rng.choice([n for n in names if n != source])
        parts = held[source]
        count = rng.randint(1, max(1, len(parts) // 2))
        first = rng.randrange(len(parts) - count + 1)
        moving = parts[first : first + count]
        detail.update(source=source, to=target, partitions=moving, target=f"{source}->{target}")
        client = Client(",".join(self.addresses), timeout=10)
        started = time.monotonic()
        detail["start_us"] = now_us()
        killed: str | None = None
        killed_at = 0.0
        try:
            (asked,) = await client.move_partitions(format_partitions(moving), target)
            detail["move_id"] = asked.id
            phases: dict[str, float] = {}
            detail["phases"] = phases
            while time.monotonic() < started + pf.hold:
                with contextlib.suppress(Exception):  # a node killed or restarting
                    status = await client.status()
                    moves = status.shard_map.moves if status.shard_map is not None else []
                    m = next((x for x in moves if x.id == asked.id), None)
                    if m is not None:
                        phases.setdefault(m.phase, round(time.monotonic() - started, 3))
                        detail["outcome"] = m.phase
                        if m.phase in ("committed", "clean_up", "done"):
                            detail.setdefault("committed_us", now_us())
                        if (
                            pf.variant == "kill-node"
                            and killed is None
                            and m.phase in ("copy", "catch_up", "cut_over")
                            and m.driver in self.target.node_ids
                        ):
                            killed, killed_at = m.driver, time.monotonic()
                            detail["killed"], detail["killed_us"] = killed, now_us()
                            detail["killed_in"] = m.phase
                            await asyncio.to_thread(self.target.kill_node, killed)
                        if m.phase in ("committed", "clean_up", "done", "rolled_back"):
                            if m.error:
                                detail["error_of_move"] = m.error[:200]
                            break
                if killed is not None and time.monotonic() - killed_at >= self.node_down_s:
                    if not self.target.node_alive(killed):
                        await asyncio.to_thread(self.target.restart_node, killed)
                await asyncio.sleep(0.1)
        finally:
            if killed is not None and not self.target.node_alive(killed):
                await asyncio.sleep(max(0.0, killed_at + self.node_down_s - time.monotonic()))
                await asyncio.to_thread(self.target.restart_node, killed)
            await client.close()
        return f"{source}->{target}"

    async def heal_all(self) -> None:
        """After the run: wake, reconnect and restart everything a fault left broken."""
        await asyncio.to_thread(self.target.heal_all)
        for i, w in enumerate(self.workers.workers):
            if w.stopped:
                self.workers.signal(i, signal.SIGCONT)
            if not w.alive():
                self.workers.spawn(i)
