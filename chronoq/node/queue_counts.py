"""The queue counts a node keeps: its owned partitions recounted from an index, and, on the
node that leads, the per-queue gauges of the whole cluster.

The recount is two loops of their own under the supervisor, never part of the firing tick:
each pass recounts the owned partitions in batches of ``RECOUNT_BATCH`` (one short
transaction each, which locks only its partitions' rows of the counts table, never a task),
and the next pass waits at least ``interval`` and at least ``1 / RECOUNT_SHARE`` times what
the last took, so however large the backlog grows, recounting takes at most that share of
the node's time and the counts get staler instead (each answer says how stale: its
``as_of``). One loop counts every state; the other READY and RUNNING only, whose index
entries sit together and are few whatever the SCHEDULED backlog: the counts an autoscaler
reads stay as fresh as ``interval`` (``ready_as_of``).

The gauges (``chronoq_queue_ready``, ``chronoq_queue_oldest_ready_seconds``) are the
cluster's sums, exported by the leading node only (one series per queue: a sum over nodes
counts each queue once), for autoscalers such as KEDA.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chronoq.cardinality import DEFAULT_METRICS_QUEUES, OTHER, top_queues
from chronoq.clock import Clock
from chronoq.coordinator.protocols import Ownership
from chronoq.limits import MAX_KEPT_QUEUES
from chronoq.models import TaskState
from chronoq.queuecounts import KEPT_STATES
from chronoq.supervision import Loop, Supervisor

#: Partitions one recount statement counts (one transaction; its cost follows their tasks,
#: and a round trip per statement is what a small backlog's pass costs).
RECOUNT_BATCH = 32
#: The same for READY and RUNNING alone (few entries per partition).
LIVE_BATCH = 128
#: The most of its time a node spends recounting (``Supervisor.every``'s ``share``).
RECOUNT_SHARE = 0.05
#: How often the leading node reads the cluster's ready counts for the gauges.
GAUGE_INTERVAL = 5.0
#: The states the frequent recount counts (their index entries are few: see above).
LIVE_STATES = (TaskState.READY, TaskState.RUNNING)


class Recounting(Protocol):
    async def recount_queues(
        self,
        partitions: list[int],
        now: datetime,
        counter: str,
        *,
        max_queues: int,
        states: tuple[TaskState, ...],
    ) -> int: ...


class ReadyCounts(Protocol):
    async def kept_ready(self) -> dict[tuple[str, str], int]: ...

    async def oldest_ready(
        self, keys: list[tuple[str, str]]
    ) -> dict[tuple[str, str], datetime]: ...


class QueueRecount:
    """Recounts this node's owned partitions into the kept counts, in ``states`` (not
    critical: only the counts' freshness depends on it)."""

    def __init__(
        self,
        store: Recounting,
        ownership: Ownership,
        clock: Clock,
        *,
        node_id: str,
        interval: float = 2.0,
        batch: int = RECOUNT_BATCH,
        states: tuple[TaskState, ...] = KEPT_STATES,
        name: str = "queue-counts",
    ) -> None:
        self._store = store
        self._ownership = ownership
        self._clock = clock
        self._node_id = node_id
        self._interval = interval
        self._batch = batch
        self._states = states
        self._name = name
        self.passes = 0
        self.read = 0  # index entries read by the last pass

    def start(self, supervisor: Supervisor) -> Loop:
        return supervisor.every(
            self._name,
            self.run,
            interval=self._interval,
            critical=False,
            share=RECOUNT_SHARE,
        )

    async def run(self) -> int:
        owned = sorted(self._ownership.owned())
        read = 0
        for i in range(0, len(owned), self._batch):
            mine = [p for p in owned[i : i + self._batch] if p in self._ownership.owned()]
            read += await self._store.recount_queues(
                mine,
                self._clock.now(),
                self._node_id,
                max_queues=MAX_KEPT_QUEUES,
                states=self._states,
            )
            await asyncio.sleep(0)  # the event loop's other work between batches
        self.passes += 1
        self.read = read
        return read


class QueueGauges:
    """The cluster's READY tasks and oldest READY age per queue, read by the leading node
    from the kept counts (a probe per queue for the age) and kept for the collector; the
    other nodes keep none."""

    def __init__(
        self,
        store: ReadyCounts,
        clock: Clock,
        *,
        leads: Callable[[], bool],
        queues: int = DEFAULT_METRICS_QUEUES,
        interval: float = GAUGE_INTERVAL,
    ) -> None:
        self._store = store
        self._clock = clock
        self._leads = leads
        self._queues = queues
        self._interval = interval
        self.ready: dict[tuple[str, str], int] = {}
        self.oldest_age: dict[tuple[str, str], float] = {}

    def start(self, supervisor: Supervisor) -> Loop:
        return supervisor.every("queue-gauges", self.poll, interval=self._interval, critical=False)

    async def poll(self) -> None:
        if not self._leads():
            self.ready, self.oldest_age = {}, {}
            return
        kept = await self._store.kept_ready()
        # Bounded once a poll (a tenant's queues cannot make the page grow without bound).
        top = top_queues({(ns, q, "READY"): n for (ns, q), n in kept.items()}, self._queues)
        ready = {(ns, q): n for (ns, q, _s), n in top.items()}
        probed = [k for k in ready if OTHER not in k]
        oldest = await self._store.oldest_ready(probed)
        now = self._clock.now()
        self.ready = ready
        self.oldest_age = {k: max(0.0, (now - at).total_seconds()) for k, at in oldest.items()}


class QueueGaugeCollector(Collector):
    """Exports the gauges the leading node keeps, at scrape time."""

    def __init__(self, gauges: Callable[[], QueueGauges | None]) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ready = GaugeMetricFamily(
            "chronoq_queue_ready",
            "READY tasks per queue across the cluster, from the counts the partition owners "
            "keep (exported by the leading node only: one series per queue).",
            labels=["namespace", "queue"],
        )
        age = GaugeMetricFamily(
            "chronoq_queue_oldest_ready_seconds",
            "Seconds since the oldest READY task of the queue came due (0 series: none "
            "ready; exported by the leading node only).",
            labels=["namespace", "queue"],
        )
        gauges = self._gauges()
        if gauges is not None:
            with contextlib.suppress(Exception):
                for (ns, queue), n in gauges.ready.items():
                    ready.add_metric([ns, queue], n)
                for (ns, queue), seconds in gauges.oldest_age.items():
                    age.add_metric([ns, queue], seconds)
        yield ready
        yield age
