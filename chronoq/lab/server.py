"""``chronoq lab``: a web page over a live local cluster, to watch buckets beat full scans.

A ``LocalCluster`` (etcd, PostgreSQL, N ``chronoq node`` processes on the cluster's virtual
clock) and one in-process worker per node run behind a small aiohttp server. A sampler reads
the store and the nodes about once a second into one JSON snapshot (``GET /api/state``); the
page (``static/``, plain JS, no network beyond loopback) draws it. The controls act on the
real cluster: COPY pending load, advance the virtual clock, SIGKILL a partition's owner and
restart it. Every figure is measured, none simulated: the scans run under EXPLAIN ANALYZE,
double firings are counted from the fencing tokens the store recorded.

The controls kill processes, so no other web page may reach them: every request passes
``guard.LabGuard`` (own Host and Origin, the per-run secret of the page's URL on every API
call, JSON bodies only).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, cast

import asyncpg
from aiohttp import web

from chronoq import errors
from chronoq.buckets import DEFAULT_PARTITIONS
from chronoq.client import Client, ClusterStatus, TaskContext, Worker
from chronoq.config import DEFAULT_TICK
from chronoq.coordinator.vclock import EtcdClock
from chronoq.diagnostics.scans import Explained
from chronoq.embedded.shards import check_store_shards
from chronoq.lab import guard, probes
from chronoq.lab.records import Advance, Counters, Load, Takeover
from chronoq.lab.stack import start_cluster
from chronoq.lab.web import (
    LabError,
    RefusalLog,
    float_field,
    guarded,
    int_field,
    json_action,
    secured,
    str_field,
)
from chronoq.local.cluster import ClusterSpec, LocalCluster
from chronoq.saturating import ms_of
from chronoq.signals import deferred_stop_signals, stop_event

log = logging.getLogger("chronoq.lab")

#: Timeline points kept for the charts (about five minutes at one a second).
TIMELINE_POINTS = 300
MAX_LOAD = 20_000_000
#: The lab's database, in the embedded PostgreSQL or the replicated one.
LAB_DATABASE = "chronoq_lab"
#: A killed owner's partitions move within this many seconds: short, so a click shows it.
LAB_LEASE_TTL = 3
#: Largest request body: the controls send a few bytes of JSON.
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class LabSettings:
    """What ``chronoq lab`` runs: the cluster and the web server."""

    host: str = "127.0.0.1"
    port: int = 8080
    nodes: int = 3
    partitions: int = DEFAULT_PARTITIONS
    lease_ttl: int = LAB_LEASE_TTL
    tick_ms: int = ms_of(DEFAULT_TICK)
    concurrency: int = 32
    data_dir: Path | None = None
    pg_members: int = 1  # >1: a replicated PostgreSQL under Patroni
    store_shards: int = 1  # >1: that many store shards, each its own server

    def __post_init__(self) -> None:
        check_store_shards(self.store_shards, self.partitions)


class Lab:
    """The live model behind the page: reads the cluster, acts on it, keeps a snapshot.

    Give it a started ``LocalCluster`` whose nodes run on the virtual clock; ``start`` adds
    the workers, the samplers and the web server, ``stop`` removes them (the cluster is the
    caller's to stop).
    """

    def __init__(
        self,
        cluster: LocalCluster,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        concurrency: int = 32,
        interval: float = 1.0,
    ) -> None:
        if not cluster.spec.virtual_clock:
            raise errors.ConfigError("the lab needs a cluster on the virtual clock")
        self.cluster = cluster
        self.host = host
        self.port = port
        self.interval = interval
        self.concurrency = concurrency
        self.width = 60  # the nodes' default bucket width; the Status RPC confirms it
        self.url = ""
        self.secret = guard.new_secret()
        self._guard: guard.LabGuard | None = None
        self._refusals = RefusalLog()
        self._pool: asyncpg.Pool | None = None
        self._clock: EtcdClock | None = None
        self._clients: dict[str, Client] = {}
        self._workers: list[Worker] = []
        self._jobs: list[asyncio.Task[Any]] = []
        self._runner: web.AppRunner | None = None
        self._counters = Counters()
        self._events: deque[dict[str, Any]] = deque(maxlen=40)
        self._timeline: deque[dict[str, Any]] = deque(maxlen=TIMELINE_POINTS)
        self._state: dict[str, Any] = {}
        self._scans: dict[str, Any] = {}
        self._status: ClusterStatus | None = None
        self._load: Load | None = None
        self._advance: Advance | None = None
        self._advancing = asyncio.Lock()
        self._takeover: Takeover | None = None
        self._scan_now = asyncio.Event()
        self._last_sample: tuple[float, datetime, int] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        spec = self.cluster.spec
        self._pool = await asyncpg.create_pool(
            self.cluster.dsn, min_size=1, max_size=4, server_settings={"timezone": "UTC"}
        )
        self._clock = EtcdClock(self.cluster.etcd_settings(spec.cluster))
        await self._clock.start()
        # A killed node's worker retries its claims every half second: not worth a warning.
        logging.getLogger("chronoq.worker").setLevel(logging.ERROR)
        for node_id, node in self.cluster.nodes.items():
            self._clients[node_id] = Client(node.address, timeout=3.0)
            worker = Worker(
                Client(node.address, timeout=10.0),
                {probes.LAB_QUEUE: self._execute},
                concurrency=self.concurrency,
                worker_id=f"lab-worker-{node_id}",
            )
            self._workers.append(worker)
            self._jobs.append(asyncio.create_task(worker.run(), name=f"lab-{node_id}"))
        self._jobs.append(asyncio.create_task(self._loop(self._sample, self.interval)))
        self._jobs.append(asyncio.create_task(self._scan_loop()))
        await self._sample()
        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self._guard = guard.LabGuard(secret=self.secret, bound_host=host, port=port)
        shown = guard.url_host(host)
        # The secret rides in the fragment: the browser keeps it out of requests and logs.
        self.url = f"http://{shown}:{port}/#{self.secret}"
        self._event("lab", f"serving http://{shown}:{port}/ over {len(self.cluster.nodes)} nodes")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        for worker in self._workers:
            worker.stop()
        for job in self._jobs:
            if not job.get_name().startswith("lab-node"):
                job.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._jobs, return_exceptions=True), timeout=15)
        for client in self._clients.values():
            await client.close()
        for worker in self._workers:
            await worker.client.close()
        if self._clock is not None:
            await self._clock.stop()
        if self._pool is not None:
            await self._pool.close()

    async def _execute(self, ctx: TaskContext) -> None:
        """The workers' handler: does nothing but note the execution (to spot a second one)."""
        if ctx.id in self._counters.executed:
            self._counters.reexecuted += 1
        self._counters.executed.add(ctx.id)

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[asyncpg.Connection]:
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            # The pool's proxy forwards every call to its Connection: the probes take either.
            yield cast(asyncpg.Connection, conn)

    @property
    def clock(self) -> EtcdClock:
        assert self._clock is not None
        return self._clock

    # ------------------------------------------------------------------ sampling

    async def _loop(self, step: Callable[[], Awaitable[None]], every: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await step()
            except (asyncpg.PostgresError, OSError, errors.ChronoqError) as exc:
                self._state["error"] = f"{type(exc).__name__}: {exc}"
                log.warning("lab sample failed: %s", exc)
            await asyncio.sleep(max(every, loop.time() - started))

    async def _sample(self) -> None:
        now = self.clock.now()
        real = time.monotonic()
        async with self._conn() as conn:
            histogram = await probes.pending_histogram(conn, now, self.width)
            counts = await probes.state_counts(conn)
            since = self._last_sample[1] if self._last_sample else now
            firing = await probes.firing_since(conn, since)
            doubles = await probes.double_firings(conn)
            if self._advance is not None:
                got = await probes.states_of(conn, self._advance.ids)
                self._advance.executed = got["executed"]
        status = await self._cluster_status()
        executed = len(self._counters.executed)
        point: dict[str, Any] = {
            "t": time.time() * 1000,
            "now": now.isoformat(),
            "pending": histogram.pending,
        }
        if self._last_sample is not None:
            dt = max(real - self._last_sample[0], 1e-3)
            point |= {
                "fired_per_s": firing.fired / dt,
                "executed_per_s": (executed - self._last_sample[2]) / dt,
                "lateness_p50_ms": firing.lateness_p50_ms,
                "lateness_p99_ms": firing.lateness_p99_ms,
            }
        scans = self._scans.get("next_minute")
        if scans is not None:
            point |= {
                "naive_examined": scans["naive"]["examined"],
                "bucketed_examined": scans["bucketed"]["examined"],
            }
        self._timeline.append(point)
        self._last_sample = (real, now, executed)
        self._state = {
            "now": now.isoformat(),
            "offset_ms": self.clock.offset / timedelta(milliseconds=1),
            "bucket_seconds": self.width,
            "partitions": self.cluster.spec.partitions,
            "histogram": dataclasses.asdict(histogram),
            "counts": {"pending": histogram.pending, **counts},
            "fired": sum(v for k, v in counts.items() if k != "cancelled"),
            "executed": counts["succeeded"],
            "double_firings": {**dataclasses.asdict(doubles), "total": doubles.total},
            "executions": {"tasks": executed, "reexecuted": self._counters.reexecuted},
            "nodes": self._nodes(status),
            "ownership": [dataclasses.asdict(o) for o in status.ownership] if status else [],
            "status_from": status.node_id if status else None,
            "error": None,
        }

    async def _cluster_status(self) -> ClusterStatus | None:
        """Status from the first live node that answers (any node sees the whole cluster)."""
        for node_id, node in self.cluster.nodes.items():
            if not node.alive():
                continue
            try:
                status = await self._clients[node_id].status(bucket_horizon=1)
            except errors.RemoteError:
                continue
            self.width = status.bucket_seconds
            self._status = status
            return status
        return None

    def _nodes(self, status: ClusterStatus | None) -> list[dict[str, Any]]:
        members = {m.node_id: m for m in status.members} if status else {}
        owned: dict[str, list[int]] = {}
        for o in status.ownership if status else []:
            owned.setdefault(o.owner, []).append(o.fencing_token)
        out = []
        for node_id, node in self.cluster.nodes.items():
            m = members.get(node_id)
            tokens = owned.get(node_id, [])
            out.append(
                {
                    "node_id": node_id,
                    "address": node.address,
                    "alive": node.alive(),
                    "pid": node.pid,
                    "member": m is not None,
                    "partitions": len(tokens),
                    "token_min": min(tokens, default=None),
                    "token_max": max(tokens, default=None),
                    "fired_total": m.fired_total if m else None,
                    "lateness_p50_ms": m.lateness_p50_ms if m else None,
                    "lateness_p99_ms": m.lateness_p99_ms if m else None,
                }
            )
        return out

    async def _scan_loop(self) -> None:
        """The naive and the bucketed scan, for real, every few seconds (and after actions).

        The naive one reads the whole table, so the period stretches to three times what the
        last round took: the lab must not become the load it measures.
        """
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self._scan()
            except (asyncpg.PostgresError, OSError) as exc:
                log.warning("lab scan failed: %s", exc)
            self._scan_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scan_now.wait(), max(2.0, 3 * (loop.time() - started)))

    async def _scan(self) -> None:
        now = self.clock.now()
        async with self._conn() as conn:
            tick = await probes.compare_scans(conn, now, self.width)
            ahead = await probes.compare_scans(conn, now + timedelta(minutes=1), self.width)
        self._scans = {
            "now": _pair(tick),
            "next_minute": _pair(ahead),
            "sampled_at": now.isoformat(),
        }

    def snapshot(self) -> dict[str, Any]:
        """Everything the page draws, as JSON-ready values."""
        return {
            **self._state,
            "scans": self._scans,
            "timeline": list(self._timeline),
            "loading": dataclasses.asdict(self._load) if self._load else None,
            "last_advance": self._advance.as_json() if self._advance else None,
            "takeover": self._takeover.as_json() if self._takeover else None,
            "events": list(self._events)[::-1],
        }

    def _event(self, kind: str, text: str) -> None:
        now = self._clock.now().isoformat() if self._clock else None
        self._events.append({"at": time.time() * 1000, "now": now, "kind": kind, "text": text})

    # ------------------------------------------------------------------ actions

    async def add_load(self, count: int) -> dict[str, Any]:
        """COPY ``count`` pending tasks spread over the day from the virtual now (background)."""
        if not 1 <= count <= MAX_LOAD:
            raise LabError(f"count must be between 1 and {MAX_LOAD:,}", 400)
        if self._load is not None and self._load.seconds is None and self._load.error is None:
            raise LabError(f"a load of {self._load.total:,} tasks is still running")
        load = self._load = Load(count)
        first = self.clock.now()
        self._jobs.append(asyncio.create_task(self._copy(load, first)))
        self._event("load", f"loading {count:,} pending tasks over the day from {first:%H:%M:%S}")
        return {"loading": count}

    async def _copy(self, load: Load, first: datetime) -> None:
        def progress(n: int) -> None:
            load.done += n

        try:
            async with self._conn() as conn:
                load.seconds = await probes.copy_pending(
                    conn, load.total, first, self.cluster.spec.partitions, self.width, progress
                )
        except (asyncpg.PostgresError, OSError) as exc:
            load.error = str(exc)
            self._event("error", f"load failed: {exc}")
            return
        self._event(
            "load",
            f"{load.total:,} tasks loaded by COPY in {load.seconds:.1f} s "
            f"({load.total / max(load.seconds, 1e-3):,.0f} rows/s)",
        )
        self._scan_now.set()

    async def advance(self, minutes: float = 1.0) -> dict[str, Any]:
        """Move the cluster's clock; wait until the tasks it made due are fired (up to 20 s)."""
        if not 0 < minutes <= 1440:
            raise LabError("minutes must be in (0, 1440]", 400)
        if self._advancing.locked():
            raise LabError("an advance is still running")
        async with self._advancing:
            delta = timedelta(minutes=minutes)
            start = self.clock.now()
            async with self._conn() as conn:
                ids = await probes.pending_ids_between(
                    conn, start, start + delta, self.cluster.spec.partitions, self.width
                )
            record = self._advance = Advance(start, start + delta, ids)
            await self.clock.advance(delta)
            jumped = time.monotonic()
            while time.monotonic() - jumped < 20:
                async with self._conn() as conn:
                    got = await probes.states_of(conn, ids)
                record.fired, record.executed, record.firers = (
                    got["fired"],
                    got["executed"],
                    got["firers"],
                )
                if record.fired == len(ids):
                    record.fired_ms = (time.monotonic() - jumped) * 1000
                    break
                await asyncio.sleep(0.05)
        took = f"in {record.fired_ms:,.0f} ms" if record.fired_ms is not None else "not all yet"
        self._event(
            "advance",
            f"clock +{minutes:g} min: {len(ids):,} tasks due, "
            f"{record.fired:,} fired {took} by {record.firers} node(s)",
        )
        self._scan_now.set()
        return record.as_json()

    async def kill_owner(self, partition: int) -> dict[str, Any]:
        """SIGKILL the node owning ``partition``; watch another one take it over."""
        status = await self._cluster_status()
        if status is None:
            raise LabError("no node answers: restart one first")
        if not 0 <= partition < status.partitions:
            raise LabError(f"partition must be in [0, {status.partitions})", 400)
        owners = {o.partition: o for o in status.ownership}
        if partition not in owners:
            raise LabError(f"partition {partition} has no owner right now; try again shortly")
        victim, token = owners[partition].owner, owners[partition].fencing_token
        if victim not in self.cluster.nodes or not self.cluster.nodes[victim].alive():
            raise LabError(f"{victim} is not running")
        lost = sum(1 for o in status.ownership if o.owner == victim)
        await asyncio.to_thread(self.cluster.kill, victim)
        takeover = self._takeover = Takeover(partition, victim, token, lost, time.monotonic())
        self._event(
            "kill",
            f"SIGKILL {victim}, owner of partition {partition} (token {token}) "
            f"and {lost - 1} other partitions",
        )
        self._jobs.append(asyncio.create_task(self._watch_takeover(takeover)))
        return takeover.as_json()

    async def _watch_takeover(self, t: Takeover) -> None:
        deadline = t.killed_at + 60
        while time.monotonic() < deadline and t.all_reowned_s is None:
            await asyncio.sleep(0.1)
            status = await self._cluster_status()
            if status is None:
                continue
            owners = {o.partition: o for o in status.ownership}
            mine = owners.get(t.partition)
            if t.new_owner is None and mine is not None and mine.owner != t.victim:
                t.new_owner, t.new_token = mine.owner, mine.fencing_token
                t.seconds = time.monotonic() - t.killed_at
                self._event(
                    "takeover",
                    f"partition {t.partition}: {mine.owner} took over "
                    f"(token {t.old_token} → {mine.fencing_token}) "
                    f"{t.seconds:.1f} s after the kill",
                )
            if len(owners) == status.partitions and all(
                o.owner != t.victim for o in owners.values()
            ):
                t.all_reowned_s = time.monotonic() - t.killed_at
                self._event(
                    "takeover",
                    f"all {status.partitions} partitions owned again, "
                    f"none by {t.victim}, {t.all_reowned_s:.1f} s after "
                    "the kill",
                )

    async def restart(self, node_id: str) -> dict[str, Any]:
        """Start a killed node again (same id and port); it rejoins and takes a share."""
        node = self.cluster.nodes.get(node_id)
        if node is None:
            raise LabError(f"no node {node_id!r}", 400)
        if node.alive():
            raise LabError(f"{node_id} is running")
        await asyncio.to_thread(self.cluster.restart_node, node_id)
        self._event("restart", f"{node_id} restarted (pid {node.pid})")
        return {"restarted": node_id, "pid": node.pid}

    # ------------------------------------------------------------------ HTTP

    def _app(self) -> web.Application:
        static = Path(str(resources.files("chronoq.lab").joinpath("static")))
        app = web.Application(
            middlewares=[guarded(lambda: self._guard, self._refusals)],
            client_max_size=MAX_BODY_BYTES,
        )
        app.on_response_prepare.append(secured)
        app.router.add_get("/", self._index)
        app.router.add_static("/static/", static)
        app.router.add_get("/api/state", self._get_state)
        post = app.router.add_post
        post("/api/load", json_action(lambda b: self.add_load(int_field(b, "count"))))
        post("/api/advance", json_action(lambda b: self.advance(float_field(b, "minutes", 1.0))))
        post("/api/kill", json_action(lambda b: self.kill_owner(int_field(b, "partition"))))
        post("/api/restart", json_action(lambda b: self.restart(str_field(b, "node"))))
        return app

    async def _index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(Path(str(resources.files("chronoq.lab"))) / "static/index.html")

    async def _get_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot())


def _pair(pair: probes.ScanPair) -> dict[str, Any]:
    def one(e: Explained) -> dict[str, Any]:
        return dataclasses.asdict(e)

    return {"at": pair.at.isoformat(), "naive": one(pair.naive), "bucketed": one(pair.bucketed)}


# ---------------------------------------------------------------------- the command


def run(settings: LabSettings, announce: Callable[[str], None] = print) -> None:
    """Start the cluster and the lab, announce the URL, run until SIGINT/SIGTERM, stop all."""
    with contextlib.ExitStack() as stack:
        workdir = settings.data_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="chronoq-lab-"))
        )
        workdir = workdir.resolve()
        spec = ClusterSpec(
            nodes=settings.nodes,
            partitions=settings.partitions,
            lease_ttl=settings.lease_ttl,
            tick_ms=settings.tick_ms,
            cluster="lab",
            virtual_clock=True,
            durable=settings.data_dir is not None,
            database=LAB_DATABASE,
        )
        store = "PostgreSQL" if settings.pg_members == 1 else f"{settings.pg_members} PostgreSQL"
        if settings.store_shards > 1:
            store = f"{settings.store_shards} store shards of {store}"
        announce(f"starting etcd, {store} and {settings.nodes} nodes in {workdir} …")
        # Signals during the start would leave half a cluster behind: defer them.
        with deferred_stop_signals() as stop_requested:
            cluster = start_cluster(
                stack, workdir, spec,
                pg_members=settings.pg_members, store_shards=settings.store_shards,
            )  # fmt: skip
        if not stop_requested:
            asyncio.run(_serve(cluster, settings, announce))


async def _serve(
    cluster: LocalCluster, settings: LabSettings, announce: Callable[[str], None]
) -> None:
    lab = Lab(cluster, host=settings.host, port=settings.port, concurrency=settings.concurrency)
    stop = stop_event()
    try:
        await lab.start()
    except OSError as exc:  # the port is taken
        await lab.stop()
        raise LabError(f"cannot serve on {settings.host}:{settings.port}: {exc.strerror}") from None
    announce(f"chronoq lab: {lab.url}  (Ctrl-C stops the lab and the cluster)")
    announce("  the link carries this run's key: open it as printed, do not share it")
    try:
        await stop.wait()
    finally:
        announce("stopping …")
        await lab.stop()
