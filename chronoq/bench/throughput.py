"""``chronoq bench throughput``: what chronoq does on this machine, beside the raw-SQL ceiling.

Phases, each on a fresh database (see ``benchmarks/README.md``):

1. raw: chronoq's own statements through asyncpg in tight loops (``chronoq.bench.raw``);
2. submit: ``Client.submit_ids`` (bulk, answered with ids) in batches through a node's gRPC API
   (node in a child process);
3. fire: a node on a ``ManualClock``; the clock jumps and its firing loop moves the tasks to READY;
4. e2e: tasks due at once, ``workers`` workers with a no-op handler, first fire to last completion,
   with the workers in this process and in one process each;
5. lateness: tasks due at ``due_rate`` per second, node on the system clock, workers running;
6. rss: the memory of a node process with each of ``pending_sizes`` tasks pending.

The module is also the entry point of the benchmark's child processes
(``python -m chronoq.bench.throughput node|worker ...``): each prints ``READY <info>`` once it
serves and one JSON line of its statistics when it stops (SIGTERM, or its stdin closing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chronoq import stats
from chronoq.bench.raw import (
    BenchError,
    Databases,
    RawCeilings,
    copy_tasks,
    measure_ceilings,
    server_settings,
)
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.clock import ManualClock
from chronoq.config import NodeSettings
from chronoq.diagnostics.task_rows import PAYLOAD, QUEUE
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.node import Node
from chronoq.redact import split_password
from chronoq.signals import on_stop_signals

PHASES = ("raw", "submit", "fire", "e2e", "lateness", "rss")
LAYOUTS = ("in-process", "processes")
TARGET_SUBMIT_PER_S = 20_000
TARGET_E2E_PER_S = 5_000
TARGET_P99_MS = 250.0
TARGET_DUE_RATE = 1_000

_CHILD_MODULE = "chronoq.bench.throughput"
_SUBMIT_BATCH = 1000


# ------------------------------------------------------------------------ results


@dataclass
class SubmitRun:
    submitters: int
    tasks: int
    seconds: float
    tasks_per_s: float


@dataclass
class FireRun:
    tasks: int
    seconds: float
    tasks_per_s: float
    statements: int
    ticks: int


@dataclass
class EndToEndRun:
    layout: str
    workers: int
    concurrency: int
    tasks: int
    completed: int
    seconds: float  # first fire to last completion, from the store's timestamps
    tasks_per_s: float
    claimed: int
    # PostgreSQL transactions (statements, here) per task: fire, claim, complete, pool resets,
    # idle polls; batching shows up as a small number
    pg_transactions_per_task: float


@dataclass
class LatenessRun:
    due_rate: int
    seconds: float
    tasks: int
    fired: int
    completed: int
    worker_layout: str
    submit_seconds: float
    submit_overran: bool  # the first run_at passed before the last batch was accepted
    store_p50_ms: float
    store_p99_ms: float
    store_max_ms: float
    node_p50_ms: float
    node_p99_ms: float
    node_max_ms: float
    # run_at to the handler's start (fire, commit, wake-up, claim, gRPC): what a user sees
    handler_p50_ms: float
    handler_p99_ms: float
    handler_max_ms: float


@dataclass
class RssRun:
    pending: int
    load_seconds: float
    settle_seconds: float
    rss_kib: int
    hwm_kib: int
    ticks: int


@dataclass
class Report:
    started_at: str
    machine: dict[str, Any]
    postgres: dict[str, Any]
    params: dict[str, Any]
    raw: RawCeilings | None = None
    submit: list[SubmitRun] = field(default_factory=list)
    fire: FireRun | None = None
    end_to_end: list[EndToEndRun] = field(default_factory=list)
    lateness: LatenessRun | None = None
    rss: list[RssRun] = field(default_factory=list)

    def best_end_to_end(self) -> EndToEndRun | None:
        return max(self.end_to_end, key=lambda r: r.tasks_per_s, default=None)

    def ratios(self) -> dict[str, float]:
        """chronoq figure / raw ceiling, for each figure that has one."""
        out: dict[str, float] = {}
        raw = self.raw
        if raw is None:
            return out
        for run in self.submit:
            out[f"submit_{run.submitters}_vs_raw_insert"] = (
                run.tasks_per_s / raw.insert_with(run.submitters)
            )
        if self.fire is not None:
            out["fire_vs_raw_fire"] = self.fire.tasks_per_s / raw.fire_per_s
        for e2e in self.end_to_end:
            out[f"e2e_{e2e.layout}_vs_raw_pipeline"] = e2e.tasks_per_s / raw.pipeline_per_s
        return out

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.raw is not None:
            data["raw"]["pipeline_per_s"] = self.raw.pipeline_per_s
        best = self.best_end_to_end()
        data["end_to_end_best"] = None if best is None else {
            "layout": best.layout, "tasks_per_s": best.tasks_per_s,
        }
        if len(self.rss) >= 2:
            data["rss_growth_kib"] = self.rss[-1].rss_kib - self.rss[0].rss_kib
        data["ratios"] = self.ratios()
        data["targets"] = {
            "submit_batched_per_s": TARGET_SUBMIT_PER_S,
            "end_to_end_per_s": TARGET_E2E_PER_S,
            "lateness_p99_ms": TARGET_P99_MS,
            "lateness_due_rate": TARGET_DUE_RATE,
        }
        return data


@dataclass(frozen=True, kw_only=True)
class Options:
    tasks: int
    workers: int
    concurrency: int
    due_rate: int
    lateness_seconds: float
    pending_sizes: tuple[int, ...]
    submitters: tuple[int, ...]
    layouts: tuple[str, ...]
    phases: tuple[str, ...]
    rss_settle_seconds: float
    logs: Path


@dataclass
class _Context:
    opts: Options
    db: Databases
    console: Console
    report: Report


# ------------------------------------------------------------------------ entry point


def main(
    *,
    tasks: int = 20000,
    workers: int = 4,
    concurrency: int = 64,
    data_dir: Path | None = None,
    dsn: str | None = None,
    due_rate: int = 1000,
    json_out: Path | None = None,
    pending_sizes: str = "10000,1000000",
    lateness_seconds: float = 20.0,
    submitters: str = "1,2,4",
    layouts: str = ",".join(LAYOUTS),
    phases: str = ",".join(PHASES),
    rss_settle_seconds: float = 5.0,
) -> None:
    """Run the throughput benchmark and print its table (and write JSON to ``json_out``).

    Args:
        tasks: Tasks per phase (submit, fire, end-to-end, and the raw ceilings).
        workers: Worker instances in the end-to-end and lateness phases.
        concurrency: Tasks each worker runs at once (also the raw claim batch).
        data_dir: Where the embedded PostgreSQL keeps its data (``<data_dir>/pgdata``) and the
            child processes their logs; a temporary directory when None.
        dsn: An existing server (``postgresql://`` URL of a database whose role may CREATE
            DATABASE); the embedded durable server when None.
        due_rate: Tasks coming due per second in the lateness phase.
        json_out: Also write every figure here as JSON.
        pending_sizes: Comma-separated pending-task counts for the node memory phase (``10k``,
            ``1M`` allowed).
        lateness_seconds: How long tasks keep coming due in the lateness phase.
        submitters: Comma-separated counts of concurrent submitters in the submit phase.
        layouts: Worker layouts to try end to end: ``in-process``, ``processes``.
        phases: Which phases to run (default all): raw, submit, fire, e2e, lateness, rss.
        rss_settle_seconds: How long a node runs its firing loop before its memory is read.
    """
    with contextlib.ExitStack() as stack:
        root = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cqbench-")))
        opts = _options(
            tasks=tasks, workers=workers, concurrency=concurrency, due_rate=due_rate,
            lateness_seconds=lateness_seconds, pending_sizes=pending_sizes,
            submitters=submitters, layouts=layouts, phases=phases,
            rss_settle_seconds=rss_settle_seconds, logs=Path(root) / "logs",
        )
        opts.logs.mkdir(parents=True, exist_ok=True)
        # Not a terminal (CI, a pipe): wide enough for the table, instead of rich's 80 columns.
        console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
        if dsn is None:
            server = EmbeddedPostgres(Path(root) / "pgdata", durable=True)
            console.print(
                f"Starting embedded PostgreSQL in {server.data_dir}, durable: fsync, "
                "synchronous_commit and full_page_writes on, as in production."
            )
            server.start(timeout=120)
            stack.callback(server.stop)
            admin_dsn = server.dsn
        else:
            admin_dsn = dsn
        report = asyncio.run(_run(opts, admin_dsn, console, embedded=dsn is None))
    console.print(render(report))
    if json_out is not None:
        Path(json_out).write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
        console.print(f"JSON written to {json_out}")


def _sizes(text: str, name: str) -> tuple[int, ...]:
    out = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1], 1)
        try:
            out.append(int(part[:-1] if scale > 1 else part) * scale)
        except ValueError:
            raise BenchError(f"{name}: {part!r} is not a count (e.g. 10000, 10k, 1M)") from None
    if not out or min(out) < 0:
        raise BenchError(f"{name}: give at least one non-negative count, got {text!r}")
    return tuple(out)


def _choices(text: str, allowed: Sequence[str], name: str) -> tuple[str, ...]:
    picked = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in picked if p not in allowed]
    if unknown or not picked:
        raise BenchError(f"{name}: choose from {', '.join(allowed)}; got {text!r}")
    return tuple(p for p in allowed if p in picked)


def _options(
    *, tasks: int, workers: int, concurrency: int, due_rate: int, lateness_seconds: float,
    pending_sizes: str, submitters: str, layouts: str, phases: str, rss_settle_seconds: float,
    logs: Path,
) -> Options:
    if min(tasks, workers, concurrency, due_rate) < 1:
        raise BenchError("tasks, workers, concurrency and due_rate must be >= 1")
    if lateness_seconds <= 0 or rss_settle_seconds < 0:
        raise BenchError("lateness_seconds must be > 0 and rss_settle_seconds >= 0")
    counts = _sizes(submitters, "submitters")
    if min(counts) < 1:
        raise BenchError("submitters: counts must be >= 1")
    return Options(
        tasks=tasks, workers=workers, concurrency=concurrency, due_rate=due_rate,
        lateness_seconds=lateness_seconds, pending_sizes=_sizes(pending_sizes, "pending_sizes"),
        submitters=counts, layouts=_choices(layouts, LAYOUTS, "layouts"),
        phases=_choices(phases, PHASES, "phases"), rss_settle_seconds=rss_settle_seconds,
        logs=logs,
    )


async def _run(opts: Options, admin_dsn: str, console: Console, *, embedded: bool) -> Report:
    settings: dict[str, Any] = {**await server_settings(admin_dsn), "embedded": embedded}
    report = Report(
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        machine={
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_at_start": os.getloadavg(),
        },
        postgres=settings,
        params={
            k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(opts).items()
        },
    )
    console.print(
        f"PostgreSQL {settings['server_version']}: fsync={settings['fsync']}, "
        f"synchronous_commit={settings['synchronous_commit']}, "
        f"full_page_writes={settings['full_page_writes']}; {os.cpu_count()} CPUs shared by "
        "server, node, clients and workers."
    )
    ctx = _Context(opts, Databases(admin_dsn), console, report)
    phases: dict[str, Callable[[_Context], Any]] = {
        "raw": _phase_raw, "submit": _phase_submit, "fire": _phase_fire, "e2e": _phase_e2e,
        "lateness": _phase_lateness, "rss": _phase_rss,
    }
    for i, name in enumerate(opts.phases, 1):
        console.rule(f"[{i}/{len(opts.phases)}] {name}")
        await phases[name](ctx)
    return report


# ------------------------------------------------------------------------ phases


async def _phase_raw(ctx: _Context) -> None:
    async with ctx.db.fresh("raw") as dsn:
        raw = await measure_ceilings(
            dsn, rows=ctx.opts.tasks, claim_batch=ctx.opts.concurrency,
            connections=sorted({1, 2, 4, *ctx.opts.submitters}),
        )
    ctx.report.raw = raw
    inserts = ", ".join(f"{n} conn {v:,.0f}" for n, v in raw.insert_per_s.items())
    claims = ", ".join(f"{n} conn {v:,.0f}" for n, v in raw.claim_complete_per_s.items())
    ctx.console.print(
        f"raw rows/s: insert {inserts}; fire {raw.fire_per_s:,.0f} "
        f"({raw.fire_statements} statements); claim+complete {claims}"
    )


async def _phase_submit(ctx: _Context) -> None:
    opts = ctx.opts
    async with ctx.db.fresh("submit") as dsn:
        node = await _Child.spawn_node("node-submit", dsn, opts.logs)
        try:
            await _submit_all(node.info, _spread_tasks(_SUBMIT_BATCH, timedelta(hours=1)), 1)
            for n in opts.submitters:
                batch = _spread_tasks(opts.tasks, timedelta(hours=1))
                seconds = await _submit_all(node.info, batch, n)
                run = SubmitRun(n, opts.tasks, seconds, opts.tasks / seconds)
                ctx.report.submit.append(run)
                ctx.console.print(
                    f"submit, {n} submitter(s): {run.tasks_per_s:,.0f} tasks/s ({seconds:.2f} s)"
                )
        finally:
            await node.stop()


async def _phase_fire(ctx: _Context) -> None:
    opts = ctx.opts
    async with ctx.db.fresh("fire") as dsn:
        clock = ManualClock()
        await copy_tasks(dsn, opts.tasks, clock.now() + timedelta(minutes=2), timedelta(minutes=1))
        node = Node(NodeSettings(dsn=dsn, port=0), clock=clock)
        await node.start()
        try:
            firer = node.firer
            assert firer is not None
            await asyncio.sleep(0.5)  # the first ticks take the fences; nothing is due yet
            before = dataclasses.replace(firer.stats)
            clock.advance(timedelta(minutes=4))
            started = time.perf_counter()
            firer.poke()
            deadline = started + 60 + opts.tasks / 500
            while firer.stats.fired - before.fired < opts.tasks:
                if time.perf_counter() > deadline:
                    raise BenchError(
                        f"fire: only {firer.stats.fired - before.fired} of {opts.tasks} fired"
                    )
                await asyncio.sleep(0.002)
            seconds = time.perf_counter() - started
            run = FireRun(
                opts.tasks, seconds, opts.tasks / seconds,
                firer.stats.statements - before.statements, firer.stats.ticks - before.ticks,
            )
        finally:
            await node.stop(grace=1.0)
    ctx.report.fire = run
    ctx.console.print(
        f"fire: {run.tasks_per_s:,.0f} tasks/s ({run.statements} statements in {run.ticks} ticks)"
    )


async def _phase_e2e(ctx: _Context) -> None:
    for layout in ctx.opts.layouts:
        run = await _end_to_end(ctx, layout)
        ctx.report.end_to_end.append(run)
        ctx.console.print(
            f"end to end, workers {layout}: {run.tasks_per_s:,.0f} tasks/s "
            f"({run.completed:,} in {run.seconds:.2f} s; "
            f"{run.pg_transactions_per_task:.3f} PostgreSQL transactions per task)"
        )


async def _end_to_end(ctx: _Context, layout: str) -> EndToEndRun:
    opts = ctx.opts
    async with ctx.db.fresh("e2e_" + layout.replace("-", "_")) as dsn:
        node = Node(NodeSettings(dsn=dsn, port=0))
        await node.start()
        try:
            async with _running_workers(
                layout, node.address, opts.workers, opts.concurrency, opts.logs
            ) as results:
                due = datetime.now(UTC) + timedelta(seconds=2)
                await copy_tasks(dsn, opts.tasks, due, timedelta(0))
                xacts_before = await _transactions(dsn)
                await _wait_for_count(
                    ctx.console, dsn, "SELECT count(*) FROM tasks WHERE state = 3", opts.tasks,
                    f"completed ({layout})", within=60 + opts.tasks / 200,
                )
                # Backends publish their statistics at most about once a second.
                await asyncio.sleep(1.2)
                xacts = await _transactions(dsn) - xacts_before
            row = await _fetchrow(
                dsn,
                "SELECT count(*) FILTER (WHERE state = 3) AS completed, min(fired_at) AS first,"
                " max(finished_at) AS last FROM tasks",
            )
        finally:
            await node.stop(grace=1.0)
    seconds = (row["last"] - row["first"]).total_seconds()
    return EndToEndRun(
        layout=layout, workers=opts.workers, concurrency=opts.concurrency, tasks=opts.tasks,
        completed=row["completed"], seconds=seconds,
        tasks_per_s=row["completed"] / seconds if seconds > 0 else 0.0,
        claimed=results.counts.get("claimed", 0),
        pg_transactions_per_task=xacts / opts.tasks,
    )


async def _phase_lateness(ctx: _Context) -> None:
    opts = ctx.opts
    best = ctx.report.best_end_to_end()
    layout = best.layout if best is not None else opts.layouts[-1]
    count = max(1, round(opts.due_rate * opts.lateness_seconds))
    async with ctx.db.fresh("lateness") as dsn:
        node = Node(NodeSettings(dsn=dsn, port=0))
        await node.start()
        try:
            async with _running_workers(
                layout, node.address, opts.workers, opts.concurrency, opts.logs
            ) as results:
                # Submitted ahead of time: leave room for the submit itself (>= 4,000/s).
                first = datetime.now(UTC) + timedelta(seconds=3 + count / 4000)
                news = [
                    NewTask(queue=QUEUE, run_at=first + timedelta(seconds=i / opts.due_rate),
                            payload=PAYLOAD)
                    for i in range(count)
                ]
                submit_seconds = await _submit_all(node.address, news, 2)
                overran = datetime.now(UTC) > first
                await _wait_for_count(
                    ctx.console, dsn, "SELECT count(*) FROM tasks WHERE state = 3", count,
                    "completed (lateness)", within=opts.lateness_seconds + 60 + count / 4000 + 3,
                )
            firer = node.firer
            assert firer is not None
            window = firer.lateness
            node_ms = [window.percentile(50) * 1e3, window.percentile(99) * 1e3, window.max * 1e3]
            samples = await _fetch_lateness(dsn)
            completed = await _fetchrow(dsn, "SELECT count(*) AS n FROM tasks WHERE state = 3")
        finally:
            await node.stop(grace=1.0)
    run = LatenessRun(
        due_rate=opts.due_rate, seconds=opts.lateness_seconds, tasks=count, fired=len(samples),
        completed=completed["n"], worker_layout=layout, submit_seconds=submit_seconds,
        submit_overran=overran, store_p50_ms=_percentile(samples, 50) * 1e3,
        store_p99_ms=_percentile(samples, 99) * 1e3, store_max_ms=max(samples, default=0) * 1e3,
        node_p50_ms=node_ms[0], node_p99_ms=node_ms[1], node_max_ms=node_ms[2],
        handler_p50_ms=_percentile(results.start_lateness, 50) * 1e3,
        handler_p99_ms=_percentile(results.start_lateness, 99) * 1e3,
        handler_max_ms=max(results.start_lateness, default=0) * 1e3,
    )
    ctx.report.lateness = run
    ctx.console.print(
        f"lateness at {run.due_rate:,}/s: p50 {run.store_p50_ms:.1f} ms, p99 "
        f"{run.store_p99_ms:.1f} ms, max {run.store_max_ms:.1f} ms (store); run_at to handler "
        f"start p50 {run.handler_p50_ms:.1f} ms, p99 {run.handler_p99_ms:.1f} ms"
        + (" [yellow]warning: submission overran the first run_at[/]" if overran else "")
    )


async def _phase_rss(ctx: _Context) -> None:
    opts = ctx.opts
    for size in opts.pending_sizes:
        async with ctx.db.fresh(f"rss_{size}") as dsn:
            load = await _load_pending(ctx.console, dsn, size)
            node = await _Child.spawn_node(f"node-rss-{size}", dsn, opts.logs)
            try:
                await asyncio.sleep(opts.rss_settle_seconds)
                rss, hwm = _memory_kib(node.pid)
            finally:
                stats = await node.stop()
        run = RssRun(size, load, opts.rss_settle_seconds, rss, hwm, int(stats.get("ticks", 0)))
        ctx.report.rss.append(run)
        ctx.console.print(
            f"node RSS with {size:,} pending: {rss / 1024:.1f} MiB (peak {hwm / 1024:.1f} MiB, "
            f"{run.ticks} firing ticks; loaded in {load:.1f} s)"
        )


# ------------------------------------------------------------------------ helpers


def _spread_tasks(count: int, spread: timedelta) -> list[NewTask]:
    """``count`` tasks due over ``spread`` starting in 5 minutes: nothing fires while we submit."""
    first = datetime.now(UTC) + timedelta(minutes=5)
    step = spread / count
    return [NewTask(queue=QUEUE, run_at=first + step * i, payload=PAYLOAD) for i in range(count)]


async def _submit_all(address: str, tasks: Sequence[NewTask], submitters: int) -> float:
    """Submit ``tasks`` in batches, ``submitters`` clients at once; seconds until all accepted."""
    batches = [tasks[i:i + _SUBMIT_BATCH] for i in range(0, len(tasks), _SUBMIT_BATCH)]
    clients = [Client(address, timeout=120) for _ in range(submitters)]
    try:
        for client in clients:
            await client.wait_ready()

        async def submit(client: Client, mine: Sequence[Sequence[NewTask]]) -> int:
            created = 0
            for batch in mine:
                created += sum(c for _id, c in await client.submit_ids(batch))
            return created

        started = time.perf_counter()
        created = await asyncio.gather(
            *(submit(c, batches[i::submitters]) for i, c in enumerate(clients))
        )
        seconds = time.perf_counter() - started
    finally:
        for client in clients:
            await client.close()
    if sum(created) != len(tasks):
        raise BenchError(f"submit: {sum(created)} of {len(tasks)} tasks were created")
    return seconds


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    )


async def _load_pending(console: Console, dsn: str, count: int) -> float:
    """COPY ``count`` tasks due over the next day, starting an hour from now."""
    with _progress(console) as progress:
        bar = progress.add_task(f"COPY {count:,} pending tasks", total=count)
        return await copy_tasks(
            dsn, count, datetime.now(UTC) + timedelta(hours=1), timedelta(days=1),
            progress=lambda n: progress.advance(bar, n),
        )


async def _wait_for_count(
    console: Console, dsn: str, sql: str, target: int, label: str, *, within: float
) -> None:
    """Poll ``sql`` (a count) until it reaches ``target``; BenchError after ``within`` s."""
    conn = await asyncpg.connect(dsn)
    try:
        with _progress(console) as progress:
            bar = progress.add_task(label, total=target)
            deadline = time.monotonic() + within
            while True:
                n = int(await conn.fetchval(sql))
                progress.update(bar, completed=n)
                if n >= target:
                    return
                if time.monotonic() > deadline:
                    raise BenchError(f"{label}: {n:,} of {target:,} after {within:.0f} s")
                await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def _fetchrow(dsn: str, sql: str) -> asyncpg.Record:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(sql)
    finally:
        await conn.close()
    assert row is not None
    return row


async def _transactions(dsn: str) -> int:
    """Transactions committed or rolled back in ``dsn``'s database so far."""
    row = await _fetchrow(
        dsn,
        "SELECT xact_commit + xact_rollback AS n FROM pg_stat_database"
        " WHERE datname = current_database()",
    )
    return int(row["n"])


async def _fetch_lateness(dsn: str) -> list[float]:
    """fired_at - run_at in seconds of every fired task, from the store."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT extract(epoch FROM fired_at - run_at)::float8 AS late FROM tasks"
            " WHERE fired_at IS NOT NULL"
        )
    finally:
        await conn.close()
    return [float(r["late"]) for r in rows]


def _percentile(samples: Sequence[float], p: float) -> float:
    """``chronoq.stats.percentile``, as ``LatenessWindow.percentile`` reports it; 0 when empty."""
    return stats.percentile(samples, p) or 0.0


def _memory_kib(pid: int) -> tuple[int, int]:
    """VmRSS and VmHWM (peak) of ``pid`` in KiB, from /proc/<pid>/status."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


# ------------------------------------------------------------------------ workers


@dataclass
class _WorkerResults:
    """Summed worker statistics and each handler's start lateness (s), filled in at stop."""

    counts: dict[str, int] = field(default_factory=dict)
    start_lateness: list[float] = field(default_factory=list)

    def add(self, stats: dict[str, Any]) -> None:
        for key, value in stats.items():
            if isinstance(value, int):
                self.counts[key] = self.counts.get(key, 0) + value
            elif key == "start_lateness" and isinstance(value, list):
                self.start_lateness.extend(float(v) for v in value)


_handler_starts: list[float] = []  # this process's handlers: seconds from run_at to start


async def _noop(ctx: TaskContext) -> None:
    """The benchmark's handler: does nothing but note how late it started."""
    _handler_starts.append((datetime.now(UTC) - ctx.run_at).total_seconds())


def _take_handler_starts() -> list[float]:
    taken = list(_handler_starts)
    _handler_starts.clear()
    return taken


@contextlib.asynccontextmanager
async def _running_workers(
    layout: str, address: str, count: int, concurrency: int, logs: Path
) -> AsyncIterator[_WorkerResults]:
    """Run ``count`` workers (``in-process``, or ``processes``: one each); results at stop."""
    results = _WorkerResults()
    _take_handler_starts()
    if layout == "in-process":
        clients = [Client(address, timeout=60) for _ in range(count)]
        workers = [
            Worker(c, {QUEUE: _noop}, concurrency=concurrency, worker_id=f"bench-{i}")
            for i, c in enumerate(clients)
        ]
        runs = [asyncio.create_task(w.run()) for w in workers]
        try:
            yield results
        finally:
            for w in workers:
                w.stop()
            for s in await asyncio.gather(*runs):
                results.add(dataclasses.asdict(s))
            results.start_lateness.extend(_take_handler_starts())
            for c in clients:
                await c.close()
        return
    spawned = await asyncio.gather(
        *(
            _Child.spawn(
                f"worker-{i}",
                ["worker", "--address", address, "--concurrency", str(concurrency),
                 "--id", f"bench-{i}"],
                logs,
            )
            for i in range(count)
        ),
        return_exceptions=True,
    )
    children = [c for c in spawned if isinstance(c, _Child)]
    try:
        for failure in spawned:
            if isinstance(failure, BaseException):
                raise failure
        yield results
    finally:
        for stats in await asyncio.gather(*(c.stop() for c in children)):
            results.add(stats)


# ------------------------------------------------------------------------ child processes


class _Child:
    """A child process running this module: ``READY <info>`` when up, a JSON line at exit."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.name = name
        self.info = ""
        self._proc = proc
        self._log = log

    @property
    def pid(self) -> int:
        return self._proc.pid

    @classmethod
    async def spawn_node(cls, name: str, dsn: str, logs: Path) -> _Child:
        """A node child on ``dsn``; its password goes in the environment, not the command line."""
        bare, password = split_password(dsn)
        return await cls.spawn(name, ["node", "--dsn", bare], logs, password=password)

    @classmethod
    async def spawn(
        cls,
        name: str,
        args: Sequence[str],
        logs: Path,
        within: float = 60.0,
        *,
        password: str | None = None,
    ) -> _Child:
        """Start ``python -m chronoq.bench.throughput <args>``; wait ``within`` s for READY."""
        log = logs / f"{name}.log"
        env = {**os.environ, "PGPASSWORD": password} if password is not None else None
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", _CHILD_MODULE, *args,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
                env=env,
            )
        child = cls(name, proc, log)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), within)
        except TimeoutError:
            line = b""
        except BaseException:
            await child.kill()
            raise
        if not line.startswith(b"READY "):
            await child.kill()
            raise BenchError(f"{name} did not start; {log} ends with:\n{_tail(log)}")
        child.info = line.decode().split(" ", 1)[1].strip()
        return child

    async def stop(self, within: float = 30.0) -> dict[str, Any]:
        """SIGTERM it, wait for its exit, return its statistics; SIGKILL after ``within`` s."""
        proc = self._proc
        assert proc.stdout is not None and proc.stdin is not None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            out = await asyncio.wait_for(proc.stdout.read(), within)
        except TimeoutError:
            out = b""
        await _exited(proc, 5.0)
        await self.kill()  # a no-op unless it is still running
        for line in reversed(out.decode(errors="replace").splitlines()):
            with contextlib.suppress(ValueError):
                stats = json.loads(line)
                if isinstance(stats, dict):
                    return stats
        return {}

    async def kill(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        await self._proc.wait()
        if self._proc.stdin is not None:
            self._proc.stdin.close()


async def _exited(proc: asyncio.subprocess.Process, within: float) -> bool:
    try:
        await asyncio.wait_for(proc.wait(), within)
    except TimeoutError:
        return False
    return True


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<cannot read {log}: {exc}>"


def _say(*words: object) -> None:
    print(*words, flush=True)


def _on_stop(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM or SIGINT, or when stdin closes (the benchmark went away)."""
    loop = asyncio.get_running_loop()
    on_stop_signals(stop, loop=loop)
    fd = sys.stdin.fileno()

    def readable() -> None:
        if not os.read(fd, 4096):
            loop.remove_reader(fd)
            stop()

    loop.add_reader(fd, readable)


async def _serve_node(dsn: str) -> None:
    node = Node(NodeSettings(dsn=dsn, port=0))
    await node.start()
    stats: dict[str, Any] = {}
    try:
        stopped = asyncio.Event()
        _on_stop(stopped.set)
        _say("READY", node.address)
        await stopped.wait()
        if node.firer is not None:
            stats = dataclasses.asdict(node.firer.stats)
    finally:
        await node.stop(grace=1.0)
    _say(json.dumps(stats))


async def _serve_worker(address: str, concurrency: int, worker_id: str) -> None:
    client = Client(address, timeout=60)
    try:
        await client.wait_ready(30)
        worker = Worker(client, {QUEUE: _noop}, concurrency=concurrency, worker_id=worker_id)
        _on_stop(worker.stop)
        _say("READY", worker_id)
        stats = await worker.run()
    finally:
        await client.close()
    _say(json.dumps({**dataclasses.asdict(stats), "start_lateness": _take_handler_starts()}))


def _child_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {_CHILD_MODULE}")
    roles = parser.add_subparsers(dest="role", required=True)
    node = roles.add_parser("node", help="serve a node until SIGTERM or stdin EOF")
    node.add_argument("--dsn", required=True)
    worker = roles.add_parser("worker", help="run a no-op worker until SIGTERM or stdin EOF")
    worker.add_argument("--address", required=True)
    worker.add_argument("--concurrency", type=int, default=64)
    worker.add_argument("--id", default=f"bench-{os.getpid()}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if args.role == "node":
        asyncio.run(_serve_node(args.dsn))
    else:
        asyncio.run(_serve_worker(args.address, args.concurrency, args.id))


# ------------------------------------------------------------------------ table


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _meets(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]below[/]"


def render(report: Report) -> Table:
    """The benchmark's table: each chronoq figure beside its raw ceiling and its target."""
    table = Table(
        title="chronoq throughput on this machine",
        caption="raw ceiling: chronoq's own SQL through asyncpg in tight loops, same run and "
        "server; pipeline = fire, then claim+complete, serially",
    )
    for name in ("measure", "chronoq", "raw ceiling", "chronoq / raw", "target"):
        first = name == "measure"
        table.add_column(name, justify="left" if first else "right", no_wrap=first)
    raw = report.raw
    for run in report.submit:
        ceiling = raw.insert_with(run.submitters) if raw else 0.0
        table.add_row(
            f"submit, batches of {_SUBMIT_BATCH}, {run.submitters} submitter"
            + ("s" if run.submitters > 1 else ""),
            _rate(run.tasks_per_s),
            f"insert, {run.submitters} conn {_rate(ceiling)}" if raw else "-",
            _pct(run.tasks_per_s, ceiling),
            f">= {TARGET_SUBMIT_PER_S:,}/s {_meets(run.tasks_per_s >= TARGET_SUBMIT_PER_S)}",
        )
    if report.fire is not None:
        table.add_row(
            "fire: firing loop to READY", _rate(report.fire.tasks_per_s),
            f"fire_due {_rate(raw.fire_per_s)}" if raw else "-",
            _pct(report.fire.tasks_per_s, raw.fire_per_s) if raw else "-", "",
        )
    best = report.best_end_to_end()
    for e2e in report.end_to_end:
        mark = " (best)" if e2e is best and len(report.end_to_end) > 1 else ""
        table.add_row(
            f"end to end, {e2e.workers} workers x {e2e.concurrency}, {e2e.layout}{mark}",
            _rate(e2e.tasks_per_s),
            (f"pipeline {_rate(raw.pipeline_per_s)} (claim+complete "
             f"{_rate(raw.claim_complete_best[1])}, {raw.claim_complete_best[0]} conn)")
            if raw else "-",
            _pct(e2e.tasks_per_s, raw.pipeline_per_s) if raw else "-",
            f">= {TARGET_E2E_PER_S:,}/s {_meets(e2e.tasks_per_s >= TARGET_E2E_PER_S)}",
        )
    _lateness_rows(table, report.lateness)
    _rss_rows(table, report.rss)
    return table


def _lateness_rows(table: Table, late: LatenessRun | None) -> None:
    if late is None:
        return
    target = f"p99 <= {TARGET_P99_MS:.0f} ms at {TARGET_DUE_RATE:,}/s"
    if late.due_rate == TARGET_DUE_RATE:
        target = f"p99 <= {TARGET_P99_MS:.0f} ms"
    table.add_row(
        f"lateness p50/p99/max, {late.due_rate:,} due/s",
        f"{late.store_p50_ms:.0f} / {late.store_p99_ms:.0f} / {late.store_max_ms:.0f} ms", "", "",
        f"{target} {_meets(late.store_p99_ms <= TARGET_P99_MS)}",
    )
    table.add_row(
        "  same, node's in-memory window",
        f"{late.node_p50_ms:.0f} / {late.node_p99_ms:.0f} / {late.node_max_ms:.0f} ms", "", "", "",
    )
    table.add_row(
        "  run_at -> handler start",
        f"{late.handler_p50_ms:.0f} / {late.handler_p99_ms:.0f} / {late.handler_max_ms:.0f} ms",
        "", "", "",
    )


def _rss_rows(table: Table, runs: Sequence[RssRun]) -> None:
    for run in runs:
        growth = ""
        if run is not runs[0]:
            growth = f"{(run.rss_kib - runs[0].rss_kib) / 1024:+.1f} MiB vs {runs[0].pending:,}"
        table.add_row(
            f"node RSS, {run.pending:,} pending", f"{run.rss_kib / 1024:.1f} MiB", "", growth,
            "flat in pending" if run is not runs[0] else "",
        )


if __name__ == "__main__":
    _child_main(sys.argv[1:])
