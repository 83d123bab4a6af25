"""``chronoq chaos``: run a real cluster, attack it while it works, check what happened.

One run: start the backend (etcd, PostgreSQL, nodes), the worker processes and an observer of
etcd's owner keys; play the seeded workload and the seeded fault schedule side by side for
``duration`` seconds; heal everything; wait (bounded) until every task has reached a final
state; stop the workers gracefully so their ledgers are complete; read the store; then check
the history and write ``history.json``, ``report.json`` and ``timeline.png`` to ``out``.
Every process started is stopped by PID in a ``finally``, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import asyncpg
from rich.console import Console

from chronoq.chaos import ledger
from chronoq.chaos.checker import Verdict, check
from chronoq.chaos.fault_plan import FaultKind, default_holds, schedule
from chronoq.chaos.faults import FaultTarget, Injector, ShardFaultTarget
from chronoq.chaos.history import History, OwnerEvent, Params, TaskRow, to_us
from chronoq.chaos.report import plot_timeline, print_report, write_json
from chronoq.chaos.worker import WorkerPool
from chronoq.chaos.workload import LEASE_TIMEOUT, Submitter, plan_tasks
from chronoq.coordinator.etcd import EtcdSettings, Keys, connect
from chronoq.coordinator.view import PrefixView
from chronoq.models import TaskState
from chronoq.shardmap import ShardMap
from chronoq.signals import stop_signals_interrupt

log = logging.getLogger("chronoq.chaos")

DEFAULT_FAULTS = (
    FaultKind.KILL_NODE, FaultKind.FREEZE_NODE, FaultKind.FREEZE_NODE_PAST_TTL,
    FaultKind.KILL_WORKER, FaultKind.PAUSE_WORKER,
    FaultKind.KILL_ETCD_MEMBER, FaultKind.KILL_ETCD_LEADER, FaultKind.RESTART_POSTGRES,
    FaultKind.CUT_NODE_ETCD, FaultKind.CUT_NODE_POSTGRES, FaultKind.CLOCK_JUMP,
    FaultKind.ROLLING_RESTART, FaultKind.DISK_FULL, FaultKind.SLOW_LINKS_ETCD,
    FaultKind.SLOW_LINKS_POSTGRES, FaultKind.CLOCK_DRIFT,
)
MAX_CLOCK_OFFSET_MS = 500  # NodeSettings.max_clock_offset's default


@dataclass(frozen=True, kw_only=True)
class ChaosOptions:
    duration: float = 120.0
    nodes: int = 3
    workers: int = 3
    etcd_members: int = 3
    faults: Sequence[FaultKind] = DEFAULT_FAULTS
    seed: int = 1
    rate: float = 50.0
    out: Path = Path("chaos-out")
    backend: str = "local"  # local | docker
    partitions: int = 64
    lease_ttl: int = 2
    tick_ms: int = 50
    concurrency: int = 16
    clock_jump_ms: int = 3000
    quiesce_timeout: float = 90.0
    plot: bool = True
    cluster: str = "chaos"  # the etcd key prefix (a docker deployment's --cluster)
    docker_services: dict[str, Any] = field(default_factory=dict)  # see docker_backend
    pg_members: int = 1  # local: >1 runs PostgreSQL members under Patroni (store faults)
    store_shards: int = 1  # local: >1 runs that many store shards, each its own server
    holds: Mapping[FaultKind, float] = field(default_factory=dict)  # over default_holds


class Backend(FaultTarget, Protocol):
    """A cluster the harness can start, reach and stop (see ``backend`` and
    ``docker_backend``)."""

    @property
    def addresses(self) -> list[str]: ...
    @property
    def dsn(self) -> str: ...
    @property
    def etcd_endpoints(self) -> list[str]: ...
    def etcd_settings(self, cluster: str) -> EtcdSettings: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


def make_backend(opts: ChaosOptions, workdir: Path) -> Backend:
    if opts.backend == "docker":
        from chronoq.chaos.docker_backend import DockerBackend

        return DockerBackend(**opts.docker_services)
    from chronoq.chaos.backend import LocalBackend
    from chronoq.chaos.disk import CAPPED_DISK_MB, MAX_WAL_SIZE
    from chronoq.local.cluster import ClusterSpec

    # disk-full: PostgreSQL on a size-capped filesystem, its WAL kept to fit on it.
    capped = FaultKind.DISK_FULL in opts.faults and opts.pg_members <= 1
    spec = ClusterSpec(
        nodes=opts.nodes, etcd_members=opts.etcd_members, partitions=opts.partitions,
        lease_ttl=opts.lease_ttl, tick_ms=opts.tick_ms, cluster=opts.cluster,
        durable=True,  # durable=False loses recent commits when PostgreSQL is killed
        postgres_settings={"max_wal_size": MAX_WAL_SIZE} if capped else {},
    )
    return LocalBackend(workdir, spec, pg_members=opts.pg_members,
                        capped_disk_mb=CAPPED_DISK_MB if capped else 0,
                        store_shards=opts.store_shards)


class OwnerObserver:
    """Records every owner key change in etcd, as the harness saw it, with its time."""

    def __init__(self, etcd: EtcdSettings, partitions: int = 0) -> None:
        self.keys = Keys(etcd.cluster)
        self.partitions = partitions
        self.client = connect(etcd)
        # Checked against etcd when quiet: a silent stream would leave the record incomplete.
        self.view = PrefixView(self.client, self.keys.owners, self._changed, verify_interval=1.0)
        self.events: list[OwnerEvent] = []
        self._seen: dict[int, tuple[str, int]] = {}

    def _changed(self) -> None:
        at = ledger.now_us()
        current = {
            self.keys.partition_of(e.key): (e.value.decode(), e.create_revision)
            for e in self.view.items.values()
        }
        for p, (owner, token) in current.items():
            if self._seen.get(p) != (owner, token):
                self.events.append(OwnerEvent(at, p, owner, token))
        for p in self._seen.keys() - current.keys():
            self.events.append(OwnerEvent(at, p, None, None))
        self._seen = current

    async def start(self) -> None:
        await self.view.start()

    async def shard_partitions(self, shard: str) -> list[int]:
        """The partitions ``shard`` holds in the shard map now (absent map: shard-0 holds
        every one)."""
        found = await self.client.get(self.keys.shard_map)
        if found is None:
            return list(range(self.partitions)) if shard == "shard-0" else []
        return list(ShardMap.from_json(found.value).held_by(shard))

    async def covered(self, partitions: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self._seen) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self._seen)} of {partitions} partitions owned")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        await self.view.stop()
        with contextlib.suppress(Exception):
            await self.client.close()


async def _store_query(dsn: str, sql: str, timeout: float = 30.0) -> list[Any]:
    """One query, retried while PostgreSQL comes back (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
            try:
                return list(await conn.fetch(sql, timeout=30))
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if time.monotonic() > deadline:
                raise
            log.info("store read failed (%s); retrying", exc)
            await asyncio.sleep(0.5)


async def quiesce(dsns: Sequence[str], timeout: float) -> int:
    """Wait until no task is SCHEDULED, READY or RUNNING on any store shard; returns how many
    still are."""
    deadline = time.monotonic() + timeout
    sql = "SELECT count(*) AS n FROM tasks WHERE state IN (0, 1, 2)"
    while True:
        left = 0
        for dsn in dsns:
            left += int((await _store_query(dsn, sql))[0]["n"])
        if left == 0 or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.5)


async def read_store(dsns: Sequence[str]) -> tuple[list[TaskRow], dict[int, int]]:
    """Every task row (live, or finished and retired into the history) and fence of every
    store shard (a fence copied by a move counts at its highest token). A task a move copied
    is counted once: from the shard that holds its partition live (a move's source keeps its
    copy until the clean-up, its target has one while it copies; neither is the task while
    the other holds it)."""
    tasks: dict[str, tuple[bool, TaskRow]] = {}
    fences: dict[int, int] = {}
    for dsn in dsns:
        found, fenced = await _read_shard(dsn)
        for live, row in found:
            if row.id not in tasks or (live and not tasks[row.id][0]):
                tasks[row.id] = (live, row)
        for partition, token in fenced.items():
            fences[partition] = max(token, fences.get(partition, token))
    return [row for _live, row in tasks.values()], fences


async def _read_shard(dsn: str) -> tuple[list[tuple[bool, TaskRow]], dict[int, int]]:
    rows = await _store_query(
        dsn,
        "SELECT id, idempotency_key, partition, state, attempt, run_at, fired_at, fired_by,"
        " fire_token, last_error, EXISTS (SELECT 1 FROM shard_partitions h"
        " WHERE h.partition = tasks.partition AND h.state = 0) AS live"
        " FROM tasks_with_history tasks",
    )
    tasks = [
        (bool(r["live"]), TaskRow(
            id=str(r["id"]), key=r["idempotency_key"], partition=int(r["partition"]),
            state=TaskState(r["state"]).name, attempt=int(r["attempt"]),
            run_at_us=to_us(r["run_at"]),
            fired_at_us=to_us(r["fired_at"]) if r["fired_at"] is not None else None,
            fired_by=r["fired_by"], fire_token=r["fire_token"], last_error=r["last_error"],
        ))
        for r in rows
    ]
    fences = {int(r["partition"]): int(r["token"])
              for r in await _store_query(dsn, "SELECT partition, token FROM partition_fences")}
    return tasks, fences


def run(opts: ChaosOptions, console: Console | None = None) -> int:
    """Run, check and report; the exit status: 0 when every check passed, 1 otherwise."""
    console = console or Console()

    # As KeyboardInterrupt, SIGTERM unwinds through collect()'s finally, which stops every
    # server and node it started.
    with stop_signals_interrupt():
        history = asyncio.run(collect(opts, console))
    verdict = judge(history, opts.out, console, plot=opts.plot)
    return 0 if verdict.ok else 1


def judge(history: History, out: Path, console: Console, *, plot: bool = True) -> Verdict:
    """Check a recorded history and write the reports (also for a saved ``history.json``)."""
    verdict = check(history)
    print_report(history, verdict, console)
    write_json(out / "report.json", history, verdict)
    if plot:
        plot_timeline(out / "timeline.png", history, verdict)
    console.print(f"reports: {out / 'report.json'}, {out / 'timeline.png'}, "
                  f"{out / 'history.json'}")
    return verdict


async def collect(opts: ChaosOptions, console: Console) -> History:
    """Run the cluster under the workload and the faults; return what was recorded."""
    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # A run owns its output folder: the data, ledgers and logs of an earlier run in it would
    # mix two histories (same seed, same idempotency keys) and void every check.
    for sub in ("cluster", "ledger", "logs"):
        shutil.rmtree(out / sub, ignore_errors=True)
    for sub in ("ledger", "logs"):
        (out / sub).mkdir(exist_ok=True)
    backend = make_backend(opts, out / "cluster")
    unsupported = set(opts.faults) - backend.supported
    if unsupported:
        raise ValueError(f"the {backend.name} backend cannot inject: "
                         + ", ".join(sorted(k.value for k in unsupported)))
    console.print(f"starting the {backend.name} cluster in {out} …")
    pool: WorkerPool | None = None
    observer: OwnerObserver | None = None
    submitter: Submitter | None = None
    await asyncio.to_thread(backend.start)
    try:
        # A fault the backend found it cannot inject here (e.g. no capped disk without root).
        skipped = {k.value: why for k, why in getattr(backend, "skipped", {}).items()
                   if k in opts.faults}
        for kind, why in skipped.items():
            console.print(f"[yellow]skipped:[/yellow] {kind}: {why}")
        kinds = [k for k in opts.faults if k.value not in skipped]
        pool = WorkerPool(backend.addresses, out / "ledger", out / "logs", count=opts.workers,
                          concurrency=opts.concurrency)
        pool.start_all()
        observer = OwnerObserver(backend.etcd_settings(opts.cluster), opts.partitions)
        await observer.start()
        await observer.covered(opts.partitions, timeout=60)
        holds = {**default_holds(opts.lease_ttl, LEASE_TIMEOUT.total_seconds()), **opts.holds}
        plan = schedule(kinds, opts.duration, opts.seed, holds)
        plans = plan_tasks(opts.seed, opts.duration, opts.rate)
        console.print(f"{len(plans)} tasks and {len(plan)} faults over {opts.duration:g} s "
                      f"(seed {opts.seed})")
        submitter = Submitter(backend.addresses, plans)
        shards = backend if isinstance(backend, ShardFaultTarget) else None
        injector = Injector(backend, pool, clock_jump_ms=opts.clock_jump_ms,
                            store=getattr(backend, "ha", None), probe=submitter.probe,
                            shards=shards, shard_partitions=observer.shard_partitions,
                            addresses=backend.addresses, node_down_s=opts.lease_ttl + 2.0)
        t0, started = datetime.now(UTC), time.monotonic()
        stop = asyncio.Event()
        faults = asyncio.create_task(injector.run(plan, started, stop))
        await submitter.run(t0)
        await asyncio.sleep(max(0.0, started + opts.duration - time.monotonic()))
        stop.set()
        await faults  # the fault in progress ends with its own heal
        await injector.heal_all()
        console.print(f"faults done ({len(injector.records)}); waiting for every task to finish …")
        dsns = getattr(backend, "store_dsns", [backend.dsn])
        left = await quiesce(dsns, opts.quiesce_timeout)
        if left:
            console.print(f"[yellow]{left} tasks still unfinished after "
                          f"{opts.quiesce_timeout:g} s[/yellow]")
        await asyncio.to_thread(pool.stop_all)
        ended = ledger.now_us()
        tasks, fences = await read_store(dsns)
        history = History(
            params=Params(lease_ttl_s=opts.lease_ttl, tick_s=opts.tick_ms / 1000,
                          lease_timeout_s=LEASE_TIMEOUT.total_seconds(),
                          partitions=opts.partitions),
            started_us=to_us(t0), ended_us=ended, submits=submitter.submits,
            cancels=submitter.cancels, executions=ledger.read_dir(out / "ledger"),
            tasks=tasks, owners=list(observer.events), faults=injector.records, fences=fences,
            meta={"seed": opts.seed, "duration": opts.duration, "rate": opts.rate,
                  "nodes": opts.nodes, "workers": opts.workers,
                  "etcd_members": opts.etcd_members, "backend": backend.name,
                  "store_shards": opts.store_shards,
                  "faults_selected": [k.value for k in opts.faults],
                  "faults_skipped": skipped,
                  # Nodes run with the default clock check: a jumped clock stops their firing.
                  "max_clock_offset_ms": MAX_CLOCK_OFFSET_MS,
                  "schedule": [(p.at, p.kind.value) for p in plan], "unfinished": left},
        )
        history.save(out / "history.json")
        return history
    finally:
        if submitter is not None:
            await submitter.close()
        if observer is not None:
            await observer.stop()
        if pool is not None:
            await asyncio.to_thread(pool.stop_all)
        await asyncio.to_thread(backend.stop)
