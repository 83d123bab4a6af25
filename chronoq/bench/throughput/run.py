"""The entry point: options checked, the server started (or a DSN used), phases run in order."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from chronoq.bench.raw import (
    BenchError,
    Databases,
    server_settings,
)
from chronoq.bench.throughput.backlog import phase_backlog
from chronoq.bench.throughput.ceilings import phase_raw
from chronoq.bench.throughput.e2e import phase_e2e
from chronoq.bench.throughput.fire import phase_fire
from chronoq.bench.throughput.keys import phase_keys
from chronoq.bench.throughput.lateness import phase_lateness
from chronoq.bench.throughput.results import (
    DEFAULT_PHASES,
    LAYOUTS,
    MAX_BACKLOG,
    MAX_BACKLOG_RUNS,
    PHASES,
    PROTOCOLS,
    SHARD_PHASES,
    Context,
    Options,
    Report,
)
from chronoq.bench.throughput.rss import phase_rss
from chronoq.bench.throughput.shards import phase_shards
from chronoq.bench.throughput.submit import phase_submit
from chronoq.bench.throughput.table import render, shard_arithmetic
from chronoq.buckets import DEFAULT_PARTITIONS
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.embedded.shards import check_store_shards
from chronoq.errors import ConfigError


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
    backlog_sizes: str = "1M",
    backlog_runs: int = 1,
    lateness_seconds: float = 20.0,
    submitters: str = "1,2,4",
    layouts: str = ",".join(LAYOUTS),
    phases: str = ",".join(DEFAULT_PHASES),
    rss_settle_seconds: float = 5.0,
    protocol: str = "stream",
    prefetch: int | None = None,
    store_shards: str | None = None,
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
        backlog_sizes: Comma-separated counts of tasks due tomorrow for the backlog phase,
            which reruns end to end and lateness on top of them and on an empty table.
        backlog_runs: Measurements of each backlog size and of the empty table, each table
            loaded once; the phase compares medians.
        lateness_seconds: How long tasks keep coming due in the lateness phase.
        submitters: Comma-separated counts of concurrent submitters in the submit phase.
        layouts: Worker layouts to try end to end: ``in-process``, ``processes``.
        phases: Which phases to run: raw, submit, fire, e2e, lateness, rss, keys (the
            default: end to end under 1,000 concurrency keys of limit 1, beside the same run
            without keys), and backlog.
        rss_settle_seconds: How long a node runs its firing loop before its memory is read.
        protocol: How workers get tasks: ``stream`` (the streaming protocol), ``riding``
            (long-polls and claims riding on acks, the protocol before streams) or ``claims``
            (long-polls only), for comparison.
        prefetch: Tasks each worker may hold beyond those it runs (``Worker(prefetch=)``);
            None: the worker's default, 0: none, for comparison.
        store_shards: Comma-separated store shard counts (``"1,2"``) for the shards phase:
            a local stack per count, each shard its own server. Given without ``phases``,
            the phases are the raw ceilings of one server and the shards phase.
    """
    if store_shards is not None and phases == ",".join(DEFAULT_PHASES):
        phases = ",".join(SHARD_PHASES)
    with contextlib.ExitStack() as stack:
        root = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cqbench-")))
        opts = options(
            tasks=tasks, workers=workers, concurrency=concurrency, due_rate=due_rate,
            lateness_seconds=lateness_seconds, pending_sizes=pending_sizes,
            submitters=submitters, layouts=layouts, phases=phases,
            rss_settle_seconds=rss_settle_seconds, logs=Path(root) / "logs",
            backlog_sizes=backlog_sizes,
        )
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
        if prefetch is not None and prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, not {prefetch}")
        if not 1 <= backlog_runs <= MAX_BACKLOG_RUNS:
            raise ValueError(f"backlog_runs must be 1 to {MAX_BACKLOG_RUNS}, not {backlog_runs}")
        opts = dataclasses.replace(
            opts, protocol=protocol, prefetch=prefetch, backlog_runs=backlog_runs,
            store_shards=shard_counts(store_shards or "1,2"),
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
            postgres = server.pid
        else:
            admin_dsn, postgres = dsn, None
        report = asyncio.run(run(opts, admin_dsn, console, postgres=postgres))
    console.print(render(report))
    for line in shard_arithmetic(report.shards, report.raw, os.cpu_count()):
        console.print(line)
    if json_out is not None:
        Path(json_out).write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
        console.print(f"JSON written to {json_out}")


def sizes(text: str, name: str) -> tuple[int, ...]:
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


def shard_counts(text: str) -> tuple[int, ...]:
    """The shards phase's store shard counts (``"1,2"``), each one a local stack can run."""
    counts = sizes(text, "store_shards")
    for count in counts:
        try:
            check_store_shards(count, DEFAULT_PARTITIONS)
        except ConfigError as exc:
            raise BenchError(str(exc)) from None
    return tuple(dict.fromkeys(counts))


def choices(text: str, allowed: Sequence[str], name: str) -> tuple[str, ...]:
    picked = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in picked if p not in allowed]
    if unknown or not picked:
        raise BenchError(f"{name}: choose from {', '.join(allowed)}; got {text!r}")
    return tuple(p for p in allowed if p in picked)


def options(
    *, tasks: int, workers: int, concurrency: int, due_rate: int, lateness_seconds: float,
    pending_sizes: str, submitters: str, layouts: str, phases: str, rss_settle_seconds: float,
    logs: Path, backlog_sizes: str = "1M",
) -> Options:
    if min(tasks, workers, concurrency, due_rate) < 1:
        raise BenchError("tasks, workers, concurrency and due_rate must be >= 1")
    if lateness_seconds <= 0 or rss_settle_seconds < 0:
        raise BenchError("lateness_seconds must be > 0 and rss_settle_seconds >= 0")
    counts = sizes(submitters, "submitters")
    if min(counts) < 1:
        raise BenchError("submitters: counts must be >= 1")
    backlog = sizes(backlog_sizes, "backlog_sizes")
    if max(backlog) > MAX_BACKLOG:
        raise BenchError(f"backlog_sizes: at most {MAX_BACKLOG:,} tasks")
    return Options(
        tasks=tasks, workers=workers, concurrency=concurrency, due_rate=due_rate,
        lateness_seconds=lateness_seconds, pending_sizes=sizes(pending_sizes, "pending_sizes"),
        submitters=counts, layouts=choices(layouts, LAYOUTS, "layouts"),
        phases=choices(phases, PHASES, "phases"), rss_settle_seconds=rss_settle_seconds,
        logs=logs, backlog_sizes=backlog,
    )


async def run(
    opts: Options, admin_dsn: str, console: Console, *, postgres: int | None
) -> Report:
    settings: dict[str, Any] = {
        **await server_settings(admin_dsn), "embedded": postgres is not None,
    }
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
    ctx = Context(opts, Databases(admin_dsn), console, report, postgres)
    phases: dict[str, Callable[[Context], Any]] = {
        "raw": phase_raw, "submit": phase_submit, "fire": phase_fire, "e2e": phase_e2e,
        "lateness": phase_lateness, "rss": phase_rss, "backlog": phase_backlog,
        "shards": phase_shards, "keys": phase_keys,
    }
    for i, name in enumerate(opts.phases, 1):
        console.rule(f"[{i}/{len(opts.phases)}] {name}")
        await phases[name](ctx)
    return report
