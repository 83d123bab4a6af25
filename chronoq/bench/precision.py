"""``chronoq bench precision``: how close to its run_at each task's handler starts.

A real local cluster (etcd, PostgreSQL, ``nodes`` node processes on 256 partitions) and one
worker process per node, each long-polling its own node, run tasks coming due at each rate
(1,000 and 5,000 per second by default) for ``seconds``. Every task is submitted ahead of
time, through every node, in an order unrelated to its run_at. Reported per rate, as the
median over ``runs`` runs:

- run_at → handler start p50 / p99 / max (each worker notes the wall clock when its handler
  starts; every process shares the machine's clock);
- run_at → fired (the store's ``fired_at``), p50 / p99, and fired → handler start per task,
  p50 / p99: which of the firing and the delivery to a handler makes the tail;
- *early*: handlers started before their run_at, plus tasks fired before it (must be 0);
- the raw ceiling of the same run: how late a bare asyncio timer in the benchmark process
  wakes for instants at the same rate, under the same load (no store, no network);
- the CPU the cluster's processes used from the first run_at until the last task completed,
  by role (nodes, workers, PostgreSQL, etcd), in cores: a latency measured on a machine whose
  cores are all busy measures the queue for them;
- what PostgreSQL's housekeeping did meanwhile (autovacuums and autoanalyzes of ``tasks``,
  checkpoints, dead rows left by the previous run); with ``pg_diagnostics``, also the
  statements that took its time, and each run's server log (every autovacuum, checkpoint, lock
  wait, and the plan of any statement over 100 ms) beside the workers' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from rich.console import Console
from rich.table import Table

from chronoq.bench import pgstats
from chronoq.bench.throughput.measure import cpu_seconds, descendants
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.heap import freeze_startup_heap
from chronoq.local.cluster import ClusterSpec, LocalCluster
from chronoq.models import DEFAULT_NAMESPACE

QUEUE = "precision"
#: Tasks per submit batch (spread over the nodes' clients).
SUBMIT_BATCH = 1000
#: Seconds between the end of submission and the first run_at (the nodes' wheels settle).
LEAD_SECONDS = 3.0
#: Submit rate assumed when planning the first run_at (tasks/s, a low estimate: a loaded
#: machine submits a few thousand a second; a task submitted after its run_at measures the
#: submit, not the firing).
PLANNED_SUBMIT_RATE = 1500
TARGETS = {1000: (5.0, 25.0), 5000: (None, 100.0)}  # due/s → (p50 ms, p99 ms) targets
_CHILD_MODULE = "chronoq.bench.precision"
#: Columns the table needs to print unwrapped.
TABLE_WIDTH = 150
#: Seconds the cluster runs before the first run: its first rebalances are over by then.
SETTLE_SECONDS = 5.0


@dataclass
class RateRun:
    rate: int
    tasks: int
    handled: int
    start_p50_ms: float
    start_p99_ms: float
    start_max_ms: float
    fire_p50_ms: float
    fire_p99_ms: float
    #: fired_at → handler start, per task: the hand-off or claim, the push and the worker.
    deliver_p50_ms: float
    deliver_p99_ms: float
    early: int
    timer_p50_ms: float
    timer_p99_ms: float
    submit_overran: bool
    #: Cores each role used while the run's tasks came due and ran (CPU seconds / seconds).
    cpu_cores: dict[str, float] = field(default_factory=dict)
    #: What PostgreSQL ran meanwhile (see ``chronoq.bench.pgstats``).
    postgres: pgstats.RunStats | None = None


@dataclass
class PrecisionReport:
    nodes: int
    partitions: int
    workers: int
    concurrency: int
    tick_ms: int
    wheel_horizon_ms: int | None
    seconds: float
    runs: list[RateRun] = field(default_factory=list)

    def medians(self) -> list[RateRun]:
        """Per rate, the median of each figure over its runs (early: the sum)."""
        out: list[RateRun] = []
        for rate in dict.fromkeys(r.rate for r in self.runs):
            mine = [r for r in self.runs if r.rate == rate]

            def med(name: str, mine: list[RateRun] = mine) -> float:
                return float(statistics.median(getattr(r, name) for r in mine))

            out.append(
                RateRun(
                    rate=rate,
                    tasks=sum(r.tasks for r in mine),
                    handled=sum(r.handled for r in mine),
                    start_p50_ms=med("start_p50_ms"),
                    start_p99_ms=med("start_p99_ms"),
                    start_max_ms=med("start_max_ms"),
                    fire_p50_ms=med("fire_p50_ms"),
                    fire_p99_ms=med("fire_p99_ms"),
                    deliver_p50_ms=med("deliver_p50_ms"),
                    deliver_p99_ms=med("deliver_p99_ms"),
                    early=sum(r.early for r in mine),
                    timer_p50_ms=med("timer_p50_ms"),
                    timer_p99_ms=med("timer_p99_ms"),
                    submit_overran=any(r.submit_overran for r in mine),
                    cpu_cores={
                        role: float(statistics.median(r.cpu_cores.get(role, 0.0) for r in mine))
                        for role in ROLES
                    },
                )
            )
        return out


def main(
    *,
    rates: str = "1000,5000",
    seconds: float = 10.0,
    runs: int = 1,
    nodes: int = 3,
    partitions: int = 256,
    concurrency: int = 32,
    tick_ms: int = 100,
    wheel_horizon_ms: int | None = None,
    data_dir: Path | None = None,
    json_out: Path | None = None,
    pg_diagnostics: bool = False,
) -> PrecisionReport:
    """Run every rate ``runs`` times on one fresh local cluster and print the table."""
    wanted = _rates(rates)
    if seconds <= 0 or runs < 1 or nodes < 1 or concurrency < 1:
        raise ValueError("seconds, runs, nodes and concurrency must be positive")
    console = Console(width=max(Console().width, TABLE_WIDTH))
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="cqprecision-"))
    extra = () if wheel_horizon_ms is None else ("--wheel-horizon-ms", str(wheel_horizon_ms))
    spec = ClusterSpec(
        nodes=nodes,
        partitions=partitions,
        tick_ms=tick_ms,
        cluster="precision",
        durable=False,
        extra_node_args=extra,
        postgres_settings=pgstats.DIAGNOSTIC_SETTINGS if pg_diagnostics else {},
    )
    report = PrecisionReport(
        nodes, partitions, nodes, concurrency, tick_ms, wheel_horizon_ms, seconds
    )
    console.print(f"starting etcd, PostgreSQL and {nodes} nodes in {workdir} …")
    with LocalCluster(workdir, spec) as cluster:
        time.sleep(SETTLE_SECONDS)  # partitions spread by load once the nodes see each other
        for run in range(runs):
            for rate in wanted:
                pg_log = cluster.postgres.log_file if cluster.postgres is not None else None
                log_from = pg_log.stat().st_size if pg_log is not None else 0
                result = asyncio.run(
                    _one_run(cluster.dsn, cluster.addresses, rate, seconds, concurrency, workdir)
                )
                report.runs.append(result)
                console.print(
                    f"run {run + 1}/{runs}, {rate:,} due/s: handler start p50 "
                    f"{result.start_p50_ms:.1f} ms, p99 {result.start_p99_ms:.1f} ms, max "
                    f"{result.start_max_ms:.1f} ms; fired p50 {result.fire_p50_ms:.1f} ms, "
                    f"p99 {result.fire_p99_ms:.1f} ms; fired → handler p50 "
                    f"{result.deliver_p50_ms:.1f} ms, p99 {result.deliver_p99_ms:.1f} ms; "
                    f"early {result.early} "
                    f"({result.handled:,}/{result.tasks:,} handled); CPU meanwhile: "
                    + ", ".join(f"{role} {cores:.2f}" for role, cores in result.cpu_cores.items())
                    + f" cores of {os.cpu_count()}"
                )
                if result.postgres is not None:
                    console.print(f"  PostgreSQL meanwhile: {result.postgres.line()}")
                    for line in result.postgres.top():
                        console.print(f"    {line}", markup=False, highlight=False)
                if pg_diagnostics and pg_log is not None:
                    kept = workdir / f"run-{run + 1}-{rate}.postgres.log"
                    kept.write_bytes(_tail_from(pg_log, log_from))
                    console.print(f"  its server log: {kept}")
    console.print(render(report))
    if json_out is not None:
        doc = {**asdict(report), "medians": [asdict(r) for r in report.medians()]}
        json_out.write_text(json.dumps(doc, indent=2))
    return report


def _tail_from(path: Path, offset: int) -> bytes:
    """What ``path`` gained past ``offset`` (all of it if it was rotated or truncated)."""
    with path.open("rb") as f:
        if f.seek(0, os.SEEK_END) >= offset:
            f.seek(offset)
        else:
            f.seek(0)
        return f.read()


def _rates(text: str) -> list[int]:
    try:
        rates = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"rates must be comma-separated integers, got {text!r}") from None
    if not rates or any(not 1 <= r <= 100_000 for r in rates):
        raise ValueError("rates must be between 1 and 100,000 per second")
    return rates


async def _one_run(
    dsn: str, addresses: list[str], rate: int, seconds: float, concurrency: int, workdir: Path
) -> RateRun:
    count = max(1, round(rate * seconds))
    await _reset(dsn)
    workers = [
        await _WorkerChild.spawn(address, concurrency, workdir / f"worker-{i}")
        for i, address in enumerate(addresses)
    ]
    try:
        first = datetime.now(UTC) + timedelta(seconds=LEAD_SECONDS + count / PLANNED_SUBMIT_RATE)
        news = [
            NewTask(queue=QUEUE, run_at=first + timedelta(seconds=i / rate)) for i in range(count)
        ]
        random.shuffle(news)  # submission order unrelated to run_at
        await _submit(addresses, news)
        overran = datetime.now(UTC) > first
        timer = asyncio.create_task(_timer_floor(first, rate, count))
        cpu_from = asyncio.create_task(_cpu_at(first))
        pg_from = await pgstats.snapshot(dsn)
        await _until_done(dsn, count, within=seconds + LEAD_SECONDS + 120)
        cpu = _cpu_used(await cpu_from)
        pg = pgstats.between(pg_from, await pgstats.snapshot(dsn))
        timer_late = await timer
    finally:
        starts = [await w.stop() for w in workers]
    handled = {task_id: late for ws in starts for task_id, late in ws}
    lateness = sorted(handled.values())
    fired_by_id = await _fire_lateness(dsn)
    fired = sorted(fired_by_id.values())
    deliver = sorted(
        late - fired_by_id[task_id] for task_id, late in handled.items() if task_id in fired_by_id
    )
    early = sum(1 for s in lateness if s < 0) + sum(1 for f in fired if f < 0)
    return RateRun(
        rate=rate,
        tasks=count,
        handled=len(lateness),
        start_p50_ms=_pct(lateness, 50) * 1e3,
        start_p99_ms=_pct(lateness, 99) * 1e3,
        start_max_ms=(lateness[-1] if lateness else 0.0) * 1e3,
        fire_p50_ms=_pct(fired, 50) * 1e3,
        fire_p99_ms=_pct(fired, 99) * 1e3,
        deliver_p50_ms=_pct(deliver, 50) * 1e3,
        deliver_p99_ms=_pct(deliver, 99) * 1e3,
        early=early,
        timer_p50_ms=_pct(timer_late, 50) * 1e3,
        timer_p99_ms=_pct(timer_late, 99) * 1e3,
        submit_overran=overran,
        cpu_cores=cpu,
        postgres=pg,
    )


#: The cluster's processes by role, as their command lines name them.
ROLES = ("nodes", "workers", "PostgreSQL", "etcd")


def _role(pid: int) -> str | None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, UnicodeDecodeError):
        return None
    if "chronoq.cli node" in cmd:
        return "nodes"
    if _CHILD_MODULE in cmd:
        return "workers"
    if "postgres" in cmd:
        return "PostgreSQL"
    if "etcd" in cmd:
        return "etcd"
    return None


def _cpu_by_pid() -> tuple[float, dict[int, tuple[str, float]]]:
    """(monotonic time, pid → (role, CPU seconds)) of this process's descendants."""
    out = {}
    for pid in descendants(os.getpid()):
        role = _role(pid)
        if role is not None:
            out[pid] = (role, cpu_seconds(pid))
    return time.monotonic(), out


async def _cpu_at(at: datetime) -> tuple[float, dict[int, tuple[str, float]]]:
    wait = (at - datetime.now(UTC)).total_seconds()
    if wait > 0:
        await asyncio.sleep(wait)
    return _cpu_by_pid()


def _cpu_used(since: tuple[float, dict[int, tuple[str, float]]]) -> dict[str, float]:
    """Cores each role used since the snapshot ``since`` (processes alive at both ends)."""
    began, before = since
    ended, after = _cpu_by_pid()
    seconds = max(ended - began, 1e-9)
    cores = dict.fromkeys(ROLES, 0.0)
    for pid, (role, used) in after.items():
        if pid in before:
            cores[role] += (used - before[pid][1]) / seconds
    return cores


async def _reset(dsn: str) -> None:
    """Forget the previous run's tasks (the nodes keep running), and vacuum them away: every
    run starts on a clean table, not on the last one's dead rows with an autovacuum due in
    the middle of its window, and on an empty table's statistics, the hardest case for the
    store's plans (see the head of queries.sql)."""
    conn = await asyncpg.connect(dsn)
    try:
        for table in ("tasks", "task_history"):  # finished tasks retire into the history
            await conn.execute(f"DELETE FROM {table}")
            await conn.execute(f"VACUUM (ANALYZE) {table}")
    finally:
        await conn.close()


async def _submit(addresses: Sequence[str], news: Sequence[NewTask]) -> None:
    clients = [Client(a, timeout=120) for a in addresses]
    try:
        batches = [news[i : i + SUBMIT_BATCH] for i in range(0, len(news), SUBMIT_BATCH)]

        async def submit(client: Client, mine: Sequence[Sequence[NewTask]]) -> None:
            for batch in mine:
                await client.submit_ids(batch)

        await asyncio.gather(
            *(submit(c, batches[i :: len(clients)]) for i, c in enumerate(clients))
        )
    finally:
        for c in clients:
            await c.close()


async def _timer_floor(first: datetime, rate: int, count: int) -> list[float]:
    """How late a bare asyncio timer wakes for the run's instants (one in ten, same load)."""
    late: list[float] = []
    for i in range(0, count, 10):
        at = first + timedelta(seconds=i / rate)
        wait = (at - datetime.now(UTC)).total_seconds()
        if wait > 0:
            await asyncio.sleep(wait)
        late.append((datetime.now(UTC) - at).total_seconds())
        await asyncio.sleep(0)
    return sorted(late)


#: Whether any task is SCHEDULED, READY or RUNNING still (cheap while a run goes on).
_UNFINISHED_SQL = (
    "SELECT EXISTS (SELECT 1 FROM tasks WHERE state = 0)"
    " OR EXISTS (SELECT 1 FROM tasks WHERE state = 1)"
    " OR EXISTS (SELECT 1 FROM tasks WHERE state = 2)"
)
_COMPLETED_SQL = "SELECT count(*) FROM tasks_with_history WHERE namespace = $1 AND state = 3"


async def _until_done(dsn: str, count: int, within: float) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + within
        while True:
            # One probe of each unfinished state's partial index, not a count of the run.
            if not await conn.fetchval(_UNFINISHED_SQL):
                done = await conn.fetchval(_COMPLETED_SQL, DEFAULT_NAMESPACE)
                if done >= count:
                    return
                raise RuntimeError(f"{count - done} of {count} tasks ended other than completed")
            if time.monotonic() > deadline:
                done = await conn.fetchval(_COMPLETED_SQL, DEFAULT_NAMESPACE)
                raise TimeoutError(f"only {done} of {count} tasks completed in {within:.0f} s")
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


async def _fire_lateness(dsn: str) -> dict[str, float]:
    """Task id → seconds from its run_at to its fired_at."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT id::text, extract(epoch FROM fired_at - run_at)::float8 AS late"
            " FROM tasks_with_history "
            "WHERE fired_at IS NOT NULL"
        )
    finally:
        await conn.close()
    return {r["id"]: r["late"] for r in rows}


def _pct(sorted_samples: Sequence[float], p: float) -> float:
    if not sorted_samples:
        return 0.0
    k = min(len(sorted_samples) - 1, max(0, round(p / 100 * len(sorted_samples)) - 1))
    return sorted_samples[k]


# ------------------------------------------------------------------------ worker processes


class _WorkerChild:
    """One worker process long-polling one node; its handler start lateness at stop."""

    def __init__(self, proc: asyncio.subprocess.Process, out: Path) -> None:
        self._proc = proc
        self._out = out

    @classmethod
    async def spawn(cls, address: str, concurrency: int, base: Path) -> _WorkerChild:
        out = base.with_suffix(".json")
        out.unlink(missing_ok=True)
        log = base.with_suffix(".log").open("ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", _CHILD_MODULE, "--address", address,
                "--concurrency", str(concurrency), "--out", str(out),
                stdin=asyncio.subprocess.PIPE, stdout=log, stderr=log,
            )  # fmt: skip
        finally:
            log.close()
        ready = base.with_suffix(".ready")
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker for {address} did not start: see {base}.log")
            await asyncio.sleep(0.05)
        ready.unlink()
        return cls(proc, out)

    async def stop(self) -> list[tuple[str, float]]:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self._proc.wait(), 30)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()
        try:
            return [(str(i), float(v)) for i, v in json.loads(self._out.read_text())]
        except (OSError, ValueError):
            return []


_starts: list[tuple[str, float]] = []


async def _handler(ctx: TaskContext) -> None:
    _starts.append((ctx.id, (datetime.now(UTC) - ctx.run_at).total_seconds()))


async def _serve_worker(address: str, concurrency: int, out: Path) -> list[tuple[str, float]]:
    client = Client(address, timeout=60)
    try:
        await client.wait_ready(30)
        worker = Worker(client, {QUEUE: _handler}, concurrency=concurrency)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        freeze_startup_heap()  # as ``chronoq worker`` does
        out.with_suffix(".ready").touch()
        await worker.run()
    finally:
        await client.close()
    return _starts


def _child_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {_CHILD_MODULE}")
    parser.add_argument("--address", required=True)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    starts = asyncio.run(_serve_worker(args.address, args.concurrency, args.out))
    args.out.write_text(json.dumps(starts))


# ------------------------------------------------------------------------ table


def render(report: PrecisionReport) -> Table:
    """Medians per rate, beside the raw timer ceiling of the same runs and the targets."""
    horizon = "default" if report.wheel_horizon_ms is None else f"{report.wheel_horizon_ms} ms"
    table = Table(
        title=f"chronoq precision: {report.nodes} nodes, {report.partitions} partitions, "
        f"{report.workers} workers x {report.concurrency}, tick {report.tick_ms} ms, "
        f"wheel horizon {horizon}",
        caption="ms from run_at, median over runs; raw ceiling: a bare asyncio timer in the "
        f"benchmark process, same instants, same load (pid {os.getpid()})",
    )
    for name in ("due/s", "tasks", "handler start p50 / p99 / max", "fired p50 / p99",
                 "fired → handler p50 / p99", "early", "raw timer p50 / p99",
                 "target"):  # fmt: skip
        table.add_column(name, justify="right")
    for r in report.medians():
        p50_target, p99_target = TARGETS.get(r.rate, (None, None))
        target = " ".join(
            part
            for part in (
                f"p50 <= {p50_target:.0f}" if p50_target is not None else "",
                f"p99 <= {p99_target:.0f}" if p99_target is not None else "",
            )
            if part
        )
        met = (p50_target is None or r.start_p50_ms <= p50_target) and (
            p99_target is None or r.start_p99_ms <= p99_target
        )
        table.add_row(
            f"{r.rate:,}",
            f"{r.handled:,}/{r.tasks:,}",
            f"{r.start_p50_ms:.1f} / {r.start_p99_ms:.1f} / {r.start_max_ms:.1f}",
            f"{r.fire_p50_ms:.1f} / {r.fire_p99_ms:.1f}",
            f"{r.deliver_p50_ms:.1f} / {r.deliver_p99_ms:.1f}",
            f"{r.early}" if not r.early else f"[red]{r.early}[/]",
            f"{r.timer_p50_ms:.1f} / {r.timer_p99_ms:.1f}",
            (target + (" [green]met[/]" if met else " [red]missed[/]")) if target else "",
        )
        if r.submit_overran:
            table.add_row("", "[yellow]submission overran the first run_at[/]", *[""] * 6)
    return table


if __name__ == "__main__":
    _child_main(sys.argv[1:])
