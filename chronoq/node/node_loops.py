"""A node's background loops: which run, in what order, how often."""

from __future__ import annotations

from chronoq.node.clock_check import ClockCheck
from chronoq.node.dispatch.readiness import ReadyBroadcast, ReadyProbe
from chronoq.node.housekeeping import (
    CounterRecount,
    DepthPoller,
    HealthWatch,
    Retention,
    StoreWatch,
)
from chronoq.node.node_shards import NodeShards
from chronoq.node.owner.engine import Owner
from chronoq.node.owner.materializer import SchedulePump
from chronoq.node.owner.reaper import Reaper
from chronoq.node.queue_counts import QueueGauges, QueueRecount
from chronoq.node.shard_admin import ShardAdmin
from chronoq.store.port import ScheduleAdmin
from chronoq.store.sharded import ShardedSchedules
from chronoq.supervision import Loop


class NodeLoops(NodeShards):
    """The node's background loops, all under its supervisor."""

    reaper: Reaper | None
    pump: SchedulePump | None
    retention: Retention | None
    depth: DepthPoller | None
    queue_recount: QueueRecount | None
    live_recount: QueueRecount | None
    queue_gauges: QueueGauges | None
    store_watch: StoreWatch | None
    health: HealthWatch | None
    schedules: ScheduleAdmin | None
    shard_admin: ShardAdmin | None
    probe: ReadyProbe | None
    broadcast: ReadyBroadcast | None
    _loops: list[Loop]

    def _start_loops(self, owner: Owner, clock_check: ClockCheck | None) -> None:
        """Every loop started, in this order (``stop`` cancels them all)."""
        assert self.reaper is not None and self.pump is not None and self.retention is not None
        assert self.depth is not None and self.store_watch is not None and self.health is not None
        assert self.probe is not None
        self._loops = [
            part.start(self.supervisor)
            for part in (
                self.reaper,
                self.pump,
                self.retention,
                self.depth,
                self.store_watch,
                self.health,
            )
        ]
        if clock_check is not None:
            self._loops.append(clock_check.start(self.supervisor))
        self._loops += self._shard_loops()
        self._loops += self._recount_loops()
        self._loops += [
            part.start(self.supervisor)
            for part in (self.queue_recount, self.live_recount, self.queue_gauges)
            if part is not None
        ]
        self._loops += self._shard_watch_loops()
        self._loops += owner.start(self.supervisor)
        # Long polls still end at their deadline without it: latency, not health, is at stake.
        probe, broadcast = self.probe, self.broadcast
        self._loops.append(
            self.supervisor.every(
                "ready-probe",
                probe.probe,
                interval=(
                    probe.interval
                    if broadcast is None
                    else lambda: broadcast.probe_interval(probe.interval)
                ),
                initial_delay=True,
                critical=False,
            )
        )
        if broadcast is not None:
            # Not critical either: without notices the probe runs at its full rate again.
            self._loops.append(
                self.supervisor.every(
                    "ready-listen", broadcast.keep_listening, interval=1.0, critical=False
                )
            )

    def _recount_loops(self) -> list[Loop]:
        """The leader's recount of the namespace counters, over a store of shards."""
        schedules, ownership = self.schedules, self.ownership
        if not isinstance(schedules, ShardedSchedules) or ownership is None:
            return []
        recount = CounterRecount(schedules.recount_due, self.clock, leads=ownership.leads)
        return [recount.start(self.supervisor)]

    def _shard_loops(self) -> list[Loop]:
        return [self.shard_admin.start(self.supervisor)] if self.shard_admin is not None else []
