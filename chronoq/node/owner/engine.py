"""The owner engine: what fires the due tasks of the partitions this node owns.

Two halves, one owner. The tick (``chronoq.node.owner.firing``) walks the owned partitions' due
ranges and is the catch-all; the timing wheel (``chronoq.node.owner.precise``, when the horizon is
above zero) fires each task at its instant and hands fired tasks to this node's worker
streams (``chronoq.node.dispatch.handoff``). Both count into one ``FiringAccount``; ownership moves,
clock jumps and the store's last answer are the engine's, not each half's.

The engine is where SCHEDULED effects end (``Offers``, for the node's ``Dispatch``, which the
engine builds over itself so that its own writes go through it too): the wheel takes those of
owned partitions within its horizon, near-future notices (``chronoq.node.dispatch.soon``) tell the
other owners of the rest and bring theirs in.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from chronoq.clock import Clock
from chronoq.config import NodeSettings
from chronoq.coordinator.protocols import Ownership
from chronoq.effects import Scheduled
from chronoq.node.dispatch.dispatcher import Dispatch
from chronoq.node.dispatch.handoff import HandOff
from chronoq.node.dispatch.readiness import ReadyNotifier
from chronoq.node.dispatch.soon import SoonBroadcast
from chronoq.node.metrics import NodeMetrics
from chronoq.node.owner.firing import Firer, FiringAccount
from chronoq.node.owner.precise import PreciseFirer, WheelStore
from chronoq.partitionmap import PartitionMap
from chronoq.store.port import Notices
from chronoq.supervision import Loop, Supervisor


class OwnerStore(WheelStore, Notices, Protocol):
    """What the owner engine asks of the store: its partitions' fires and loads, a failed
    hand-off's give-back by task id, and the near-future notices."""


class Owner:
    """The owner engine of this node's partitions: the tick, the timing wheel (None when
    ``wheel_horizon`` is 0), the near-future notices (a cluster node with notices on), and
    ``dispatch``, the node's one dispatcher, which offers SCHEDULED tasks here.

    ``handoff``: the worker streams fired tasks may be leased to (None: no hand-off).
    """

    def __init__(
        self,
        store: OwnerStore,
        ownership: Ownership,
        clock: Clock,
        settings: NodeSettings,
        *,
        partitions: PartitionMap,
        notifier: ReadyNotifier,
        handoff: HandOff | None = None,
        metrics: NodeMetrics | None = None,
    ) -> None:
        s = settings
        self.dispatch = Dispatch(notifier, clock, self)
        self.account = FiringAccount(node_id=s.node_id, metrics=metrics)
        with_wheel = s.wheel_horizon > timedelta(0)
        self.tick = Firer(
            store,
            ownership,
            clock,
            tick=s.tick.total_seconds(),
            batch=s.fire_batch,
            rounds=s.fire_rounds,
            on_effects=self.dispatch.apply,
            node_id=s.node_id,
            metrics=metrics,
            catch_all=s.catch_all.total_seconds() if with_wheel else None,
            account=self.account,
        )
        self.wheel: PreciseFirer | None = None
        self.soon: SoonBroadcast | None = None
        if with_wheel:
            self.wheel = PreciseFirer(
                store,
                ownership,
                clock,
                self.account,
                partitions=partitions,
                horizon=s.wheel_horizon,
                capacity=s.wheel_capacity,
                node_id=s.node_id,
                handoff=handoff,
                on_effects=self.dispatch.apply,
            )
            if s.ready_notices and s.cluster is not None:
                self.soon = SoonBroadcast(store, s.node_id, self.wheel.told)

    def start(self, supervisor: Supervisor) -> list[Loop]:
        """The tick, the wheel's load and fire loops, and the notices' listener (not
        critical: without notices owners find near-future tasks by loading)."""
        loops = [self.tick.start(supervisor)]
        if self.wheel is not None:
            loops += self.wheel.start(supervisor)
        if self.soon is not None:
            loops.append(
                supervisor.every(
                    "soon-listen", self.soon.keep_listening, interval=1.0, critical=False
                )
            )
        return loops

    def offer(self, scheduled: Sequence[Scheduled], now: datetime) -> None:
        """Tasks made SCHEDULED at ``now``: the wheel takes those of owned partitions within
        its horizon, their owners hear of the other near-future ones (no wheel: the tick
        fires them)."""
        if self.wheel is None:
            return
        others = self.wheel.offer(scheduled, now)
        if others and self.soon is not None:
            self.soon.publish(others)

    def moved(self, partitions: set[int]) -> None:
        """Ownership of ``partitions`` moved: forget cached watermarks and what the wheel
        holds of them, and fire at once (backfill included)."""
        if self.wheel is not None:
            self.wheel.forget(partitions)
        self.tick.forget(partitions)
        self.tick.poke()

    def clock_jumped(self) -> None:
        """Fire what became due, read the wheel's window again."""
        if self.wheel is not None:
            self.wheel.poke()
        self.tick.poke()

    def last_ok(self) -> float:
        """When (monotonic) an owner statement last reached the store: the tick's, or the
        wheel's loads (the tick may be long when the wheel fires)."""
        return max(self.tick.last_ok, self.wheel.last_ok if self.wheel is not None else 0.0)

    def figures(self) -> dict[str, float]:
        """The figures a node publishes about its firing (status, the lab)."""
        return {
            "lateness_p50_ms": self.account.lateness.percentile(50) * 1000,
            "lateness_p99_ms": self.account.lateness.percentile(99) * 1000,
            "fired": float(self.account.stats.fired),
        }

    async def close(self) -> None:
        if self.soon is not None:
            await self.soon.close()
