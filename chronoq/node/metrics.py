"""Prometheus metrics of one node, in a registry of its own (several nodes may share a process).

Counters of the API are incremented where things happen; figures the node already keeps
(firing stats, lease renewals, owned partitions, queue depth) are read at scrape time by a
collector, so the firing hot path pays nothing extra for them.

A scrape is cheap whoever sends it: label sets tenants choose are bounded before they get here
(``chronoq.cardinality``), the page is rendered in the HTTP server's threads, never on the
event loop, and at most once per ``SCRAPE_CACHE`` however many scrapers ask (the others get
the same bytes), and a client that stalls its request gives its thread back after
``SCRAPE_TIMEOUT``. The endpoint listens on loopback unless the operator binds it elsewhere,
and elsewhere only with a bearer token (``NodeSettings.metrics_token_file``): a request
without it is answered 401 before anything is rendered, so a flood of them costs a hash each.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, ThreadingWSGIServer, generate_latest
from prometheus_client.registry import Collector

from chronoq.auth import ScrapeToken
from chronoq.cardinality import top_queues
from chronoq.config import NodeSettings
from chronoq.coordinator.credentials import read_password
from chronoq.supervision import Loop

LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
ROWS_BUCKETS = (0, 1, 10, 100, 1_000, 10_000, 100_000)

#: How long one rendering of /metrics is served again: scrape loops cost one render a second.
SCRAPE_CACHE = 1.0
#: A scrape connection idle this long (request not sent, answer not read) is closed.
SCRAPE_TIMEOUT = 10.0
_UNAUTHORIZED = b"401: send Authorization: Bearer <the token of --metrics-token-file>\n"


def scrape_token(settings: NodeSettings) -> ScrapeToken | None:
    """The token scrapes of ``settings`` must send: read from its file (refused, like a
    password file, if another account could read, rewrite or replace it: owner, mode, every
    directory up to /), or given inline; None: no token (loopback only)."""
    if settings.metrics_token_file is not None:
        path = settings.metrics_token_file
        return ScrapeToken(read_password(path, "metrics token file"), source=path)
    if settings.metrics_token is not None:
        return ScrapeToken(settings.metrics_token, source="CHRONOQ_METRICS_TOKEN")
    return None


class NodeMetrics:
    """The metric objects of a node; ``serve(port)`` exposes them over HTTP."""

    def __init__(
        self, node_id: str, *, cache: float = SCRAPE_CACHE, token: ScrapeToken | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.page = ScrapePage(self.registry, cache, token=token)
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
            "chronoq_tasks_purged",
            "Finished tasks deleted row by row: DEAD letters past their retention, and "
            "finished tasks already past it when the sweep reached them.",
            registry=r,
        )
        self.retired = Counter(
            "chronoq_tasks_retired",
            "Finished tasks moved from the live table into the task history.",
            registry=r,
        )
        self.slices_dropped = Counter(
            "chronoq_history_slices_dropped",
            "Time slices of the task history dropped whole by retention (on any shard).",
            registry=r,
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
        """Start the /metrics HTTP endpoint (a thread of its own); returns the bound port."""
        server_class = _IPv6Server if ":" in host else ThreadingWSGIServer
        self._server = make_server(
            host, port, self.page.app, server_class, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="chronoq-metrics", daemon=True
        )
        self._thread.start()
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class ScrapePage:
    """The rendered /metrics, served again for ``cache`` seconds; a WSGI app (``app``).

    Rendering runs in the calling (HTTP server) thread under a lock: scrapers that arrive
    while one renders wait for that rendering instead of starting their own. With a ``token``,
    a request that does not carry it is refused (401) before it can cause a rendering.
    """

    def __init__(
        self, registry: CollectorRegistry, cache: float, *, token: ScrapeToken | None = None
    ) -> None:
        self._registry = registry
        self._cache = cache
        self._token = token
        self.refused = 0  # requests answered 401
        self._lock = threading.Lock()
        self._rendered_at = float("-inf")
        self._plain = b""
        self._gzipped: bytes | None = None  # the page compressed, once a scraper asked
        self.renders = 0  # how many times the registry was rendered (collected)
        self.compressions = 0  # how many renderings were compressed (at most one each)

    @property
    def guarded(self) -> bool:
        """Whether requests must carry the bearer token."""
        return self._token is not None

    def body(self, *, gzipped: bool = False) -> bytes:
        """The current page, rendered if the last one is older than ``cache`` seconds; it is
        compressed when a scraper first asks for gzip, then served compressed to the others
        until the next rendering."""
        with self._lock:
            now = time.monotonic()
            if now - self._rendered_at >= self._cache:
                self._plain = generate_latest(self._registry)
                self._gzipped = None
                self._rendered_at = time.monotonic()
                self.renders += 1
            if not gzipped:
                return self._plain
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._plain, compresslevel=1)
                self.compressions += 1
            return self._gzipped

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if self._token is not None and not self._token.admits(environ.get("HTTP_AUTHORIZATION")):
            self.refused += 1
            start_response(
                "401 Unauthorized",
                [
                    ("Content-Type", "text/plain"),
                    ("Content-Length", str(len(_UNAUTHORIZED))),
                    ("WWW-Authenticate", 'Bearer realm="chronoq metrics"'),
                ],
            )
            return [_UNAUTHORIZED]
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: /metrics is the only page\n"]
        gzipped = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        body = self.body(gzipped=gzipped)
        headers = [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr, and a deadline on every read and write of a connection."""

    timeout = SCRAPE_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _IPv6Server(ThreadingWSGIServer):
    address_family = socket.AF_INET6


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


class PausedCollector(Collector):
    """``chronoq_queue_paused``: 1 per paused queue, as the node's dispatch gate last read
    them. Bounded like the depth: at most ``cap`` queues have a series of their own, the rest
    are counted per namespace (``top_queues``: the value is then how many are paused)."""

    def __init__(self, paused: Callable[[], Iterable[tuple[str, str]]], cap: int) -> None:
        self._paused = paused
        self._cap = cap

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gauge = GaugeMetricFamily(
            "chronoq_queue_paused",
            "Paused queues (1 each; a namespace's queues past the series bound are summed "
            'under queue "(other)"), as this node\'s dispatch gate last read them.',
            labels=["namespace", "queue"],
        )
        with contextlib.suppress(Exception):
            flags = {(ns, queue, ""): 1 for ns, queue in self._paused()}
            for (ns, queue, _), n in sorted(top_queues(flags, self._cap).items()):
                gauge.add_metric([ns, queue], n)
        yield gauge
