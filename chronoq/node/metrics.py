"""Prometheus metrics of one node, in a registry of its own (several nodes may share a process).

Counters of the API are incremented where things happen; figures the node already keeps
(firing stats, lease renewals, owned partitions, queue depth) are read at scrape time by a
collector, so the firing hot path pays nothing extra for them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from chronoq.supervision import Loop

LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
ROWS_BUCKETS = (0, 1, 10, 100, 1_000, 10_000, 100_000)


class NodeMetrics:
    """The metric objects of a node; ``serve(port)`` exposes them over HTTP."""

    def __init__(self, node_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.node_id = node_id
        r = self.registry
        self.submitted = Counter("chronoq_tasks_submitted", "Tasks accepted (created).", registry=r)
        self.fired = Counter("chronoq_tasks_fired", "Tasks moved SCHEDULED → READY.", registry=r)
        self.skipped = Counter(
            "chronoq_tasks_skipped", "Tasks skipped by their misfire policy.", registry=r
        )
        self.completed = Counter("chronoq_tasks_completed", "Tasks completed.", registry=r)
        self.failed = Counter("chronoq_tasks_failed", "Attempts failed by workers.", registry=r)
        self.dead = Counter("chronoq_tasks_dead", "Tasks that ended DEAD.", registry=r)
        self.reaped = Counter("chronoq_leases_expired", "Expired worker leases reaped.", registry=r)
        self.purged = Counter(
            "chronoq_tasks_purged", "Finished tasks purged by retention.", registry=r
        )
        self.lateness = Histogram(
            "chronoq_fire_lateness_seconds",
            "Time from run_at to firing.",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.rows_per_tick = Histogram(
            "chronoq_fire_rows_per_tick",
            "Rows examined per firing tick (the bucketed scan reads the due rows only).",
            buckets=ROWS_BUCKETS,
            registry=r,
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP endpoint; returns the bound port."""
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class LiveCollector(Collector):
    """Reads the node's own figures at scrape time."""

    def __init__(
        self,
        owned: Callable[[], int],
        lease: Callable[[], tuple[int, int]],
        depth: Callable[[], dict[tuple[str, str, str], int]],
    ) -> None:
        self._owned = owned
        self._lease = lease
        self._depth = depth

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            "chronoq_owned_partitions", "Partitions this node fires now.", value=self._owned()
        )
        renewals, losses = self._lease()
        yield CounterMetricFamily(
            "chronoq_lease_renewals", "Successful etcd lease keepalives.", value=renewals
        )
        yield CounterMetricFamily("chronoq_lease_losses", "etcd leases lost.", value=losses)
        depth = GaugeMetricFamily(
            "chronoq_queue_depth",
            "Tasks per namespace, queue and state (READY and RUNNING exact; SCHEDULED for "
            "the coming hour), as of the last depth poll.",
            labels=["namespace", "queue", "state"],
        )
        with contextlib.suppress(Exception):
            for (ns, queue, state), n in self._depth().items():
                depth.add_metric([ns, queue, state], n)
        yield depth


class LoopCollector(Collector):
    """The supervised loops' figures, read at scrape time: failed passes, restarts, health."""

    def __init__(self, loops: Callable[[], Iterable[Loop]]) -> None:
        self._loops = loops

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        failures = CounterMetricFamily(
            "chronoq_loop_failures",
            "Failed passes of each background loop (deaths included).",
            labels=["loop"],
        )
        restarts = CounterMetricFamily(
            "chronoq_loop_restarts",
            "Times a background loop died and was started again.",
            labels=["loop"],
        )
        healthy = GaugeMetricFamily(
            "chronoq_loop_healthy",
            "1 while the loop works; 0 once it died, keeps failing or hangs (a critical "
            "loop at 0 turns the node's health NOT_SERVING).",
            labels=["loop", "critical"],
        )
        for loop in self._loops():
            failures.add_metric([loop.name], loop.failures)
            restarts.add_metric([loop.name], loop.restarts)
            healthy.add_metric([loop.name, str(loop.critical).lower()], 1 if loop.healthy else 0)
        yield failures
        yield restarts
        yield healthy
