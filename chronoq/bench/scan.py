"""``chronoq bench scan``: finding this minute's due tasks, bucketed against naive scans.

For each pending size the benchmark loads a fresh database on the real store (COPY, through
``chronoq.bench.raw.copy_tasks``): ``pending`` SCHEDULED tasks spread evenly over one day of
one-minute buckets from *now*, and a fired history over the day before (as large as the
pending set by default, ``history`` times it in general; 99 % SUCCEEDED, 1 % READY), in
submission order rather than run_at order (see ``scattered_rows``; ``--order sorted`` loads
run_at order instead). Then it times, at a tick 59 s into the first bucket, the query that
finds the tasks due by now, six ways:

- ``a``: full-table scan ``run_at <= $now AND state = 0`` (index scans switched off);
- ``b``: an index on ``run_at`` (built for the benchmark), walking the fired history;
- ``b2``: the same index bounded below by a watermark (``run_at >= $watermark``);
- ``c``: chronoq's firing scan (``fire_due``'s own CTEs, as a SELECT) of one partition;
- ``c2``: the same over the partitions one node of ``nodes`` owns;
- ``c3``: the same over every partition (one node alone).

``b`` and ``b2`` run with ``tasks_due`` and ``tasks_listing`` dropped inside a rolled-back
transaction, so the planner sees the naive scheduler's schema. Every figure comes from the
server: rows examined and buffers from ``EXPLAIN (ANALYZE, BUFFERS)`` (the plans are saved as
text), milliseconds per tick as the median of several timed executions of the statement.
Parallel query is off, so a tick is one backend's work; the cache is warm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from chronoq.bench.raw import BenchError, Databases, copy_tasks, server_settings
from chronoq.bench.scan_report import (
    Load,
    Measurement,
    ScanReport,
    arithmetic,
    plot,
    render,
    sized,
    verdict,
)
from chronoq.buckets import (
    DEFAULT_BUCKET_SECONDS,
    DEFAULT_PARTITIONS,
    bucket_of,
    bucket_start,
)
from chronoq.diagnostics.scans import (
    RUN_AT_INDEX,
    Strategy,
    explain_analyze,
    fire_limit,
    strategies,
    strategy_session,
)
from chronoq.diagnostics.task_rows import COPY_COLUMNS, copy_rows, task_rows
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.models import TaskState
from chronoq.store.sql import q

DAY = timedelta(days=1)
#: Where in the current bucket the measured tick happens: near its end, so "due" is a minute.
TICK_OFFSET = timedelta(seconds=59)
#: Extra columns a history row fills beyond ``COPY_COLUMNS``.
HISTORY_COLUMNS = (*COPY_COLUMNS, "fired_at", "fired_by", "fire_token", "finished_at", "attempt")
#: Heap orders a load can have; see ``scattered_rows``.
ORDERS = ("scattered", "sorted")
#: Stop repeating a strategy once its timed runs took this long (at least one run each).
TIME_BUDGET_S = 8.0
#: The largest fired history ``--history`` allows, as a multiple of the pending set.
MAX_HISTORY = 10.0

# ------------------------------------------------------------------------ entry point


def parse_sizes(text: str) -> list[int]:
    """``"100k,1m,10m"`` → ``[100000, 1000000, 10000000]`` (``k``/``m`` suffixes, decimals ok)."""
    sizes = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1], 1)
        try:
            value = float(part[:-1] if scale > 1 else part) * scale
        except ValueError:
            raise ValueError(f"--sizes: {part!r} is not a count (e.g. 100k, 1m, 250000)") from None
        if value < 1 or value != int(value):
            raise ValueError(f"--sizes: {part!r} must be a whole number of tasks >= 1")
        sizes.append(int(value))
    if not sizes:
        raise ValueError(f"--sizes: give at least one size, got {text!r}")
    return sorted(set(sizes))


def main(
    *,
    sizes: str = "100k,1m",
    repeats: int = 5,
    partitions: int = DEFAULT_PARTITIONS,
    nodes: int = 3,
    order: str = "scattered",
    data_dir: Path | None = None,
    dsn: str | None = None,
    out_dir: Path = Path("bench-scan"),
    console: Console | None = None,
    only: str | None = None,
    history: float = 1.0,
) -> ScanReport:
    """Load each size, measure every strategy, print the table, write JSON, plans and a plot.

    Args:
        sizes: Comma-separated pending counts (``100k,1m,10m``); each also gets a fired
            history of ``history`` times its size.
        repeats: Timed executions per strategy (fewer when a strategy is slow).
        partitions: Hash partitions of the loaded tasks (chronoq's default is 256).
        nodes: Cluster size for ``c2``: one node owns ``partitions / nodes`` partitions.
        order: Heap order of the load: ``scattered`` (as tasks arrive in service, run_at
            uncorrelated with position) or ``sorted`` (``copy_tasks``' run_at order).
        data_dir: Where the embedded PostgreSQL keeps its data; a temporary directory if None.
        dsn: An existing server instead (a ``postgresql://`` URL whose role may CREATE
            DATABASE); each size gets a fresh database there, dropped afterwards.
        out_dir: Receives ``scan.json``, ``scan-plans.txt`` and ``scan.png``.
        console: Where to print (stdout by default).
        only: Comma-separated strategy keys to measure (default all), e.g. ``a,b2,c,c2,c3``
            to leave out (b), whose tick walks the whole history (minutes at 20M).
        history: The fired history's size as a fraction of the pending set's (0 to 10): a
            smaller one lets a larger pending set fit the disk (without one, ``b`` has no
            history to walk).
    """
    counts = parse_sizes(sizes)
    if repeats < 1 or partitions < 1 or not 1 <= nodes <= partitions:
        raise ValueError("need repeats >= 1, partitions >= 1 and 1 <= nodes <= partitions")
    if not 0 <= history <= MAX_HISTORY:
        raise ValueError(f"--history: give a fraction of the pending set from 0 to "
                         f"{MAX_HISTORY:g}, got {history:g}")
    if order not in ORDERS:
        raise ValueError(f"--order: choose from {', '.join(ORDERS)}, got {order!r}")
    keys = _strategy_keys(only)
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        admin_dsn = dsn
        if admin_dsn is None:
            root = data_dir or Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="cqscan-"))
            )
            server = EmbeddedPostgres(Path(root) / "pgdata", durable=False)
            console.print(f"Starting embedded PostgreSQL in {server.data_dir} (fsync off: "
                          "this benchmark measures reads).")
            server.start(timeout=120)
            stack.callback(server.stop)
            admin_dsn = server.dsn
        report = asyncio.run(
            _run(counts, admin_dsn, repeats, partitions, nodes, order, out_dir, console, keys,
                 history)
        )
    console.print(render(report))
    console.print(arithmetic(report))
    console.print(verdict(report))
    return report


async def _run(
    counts: Sequence[int], admin_dsn: str, repeats: int, partitions: int, nodes: int,
    order: str, out_dir: Path, console: Console, keys: frozenset[str] | None = None,
    history: float = 1.0,
) -> ScanReport:
    report = ScanReport(
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        machine={"cpus": os.cpu_count(), "python": platform.python_version(),
                 "platform": platform.platform(), "loadavg_at_start": os.getloadavg()},
        server=await server_settings(admin_dsn),
        partitions=partitions, nodes=nodes, bucket_seconds=DEFAULT_BUCKET_SECONDS,
        repeats=repeats, order=order,
    )
    plans_path = out_dir / "scan-plans.txt"
    databases = Databases(admin_dsn, prefix="chronoq_scan")
    with plans_path.open("w") as plans:
        plans.write(f"chronoq bench scan, {report.started_at}, PostgreSQL "
                    f"{report.server.get('server_version')}\n")
        for count in counts:
            async with databases.fresh(_label(count)) as dsn:
                fired = round(count * history)
                load, now = await _load(dsn, count, fired, partitions, report.order, console)
                report.loads.append(load)
                console.print(
                    f"{sized(count)} pending + {sized(fired)} history loaded in "
                    f"{load.total_s:.1f} s (COPY {load.copy_s:.1f} s, "
                    f"indexes {load.index_s:.1f} s, VACUUM ANALYZE {load.vacuum_s:.1f} s); "
                    f"table {load.table_mb:.0f} MB, indexes {load.indexes_mb:.0f} MB"
                )
                for m in await _measure_all(dsn, load, now, report, plans, console, keys):
                    report.measurements.append(m)
    report.outputs["plans"] = str(plans_path)
    json_path = out_dir / "scan.json"
    report.outputs["json"] = str(json_path)
    png_path = out_dir / "scan.png"
    plot(report, png_path)
    report.outputs["plot"] = str(png_path)
    json_path.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    console.print(f"plans: {plans_path}  JSON: {json_path}  plot: {png_path}")
    return report


def _label(count: int) -> str:
    return sized(count).lower().replace(".", "_")


# ------------------------------------------------------------------------ loading


async def _load(
    dsn: str, count: int, fired: int, partitions: int, order: str, console: Console
) -> tuple[Load, datetime]:
    """Pending over the coming day, history over the past day; returns the tick's ``now``.

    Secondary indexes are dropped for the COPY and built afterwards (what any bulk load
    does: a sorted build beats millions of random B-tree inserts); the resulting schema is
    chronoq's own, plus the benchmark's ``run_at`` index. VACUUM sets hint bits and the
    visibility map, as autovacuum would have on a table in service.
    """
    first = bucket_start(bucket_of(datetime.now(UTC)))
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET maintenance_work_mem = '1GB'")
        indexes = await _drop_indexes(conn)
        started = time.perf_counter()
        with _progress(console) as progress:
            pending_bar = progress.add_task(f"COPY {sized(count)} pending", total=count)
            history_bar = progress.add_task(f"COPY {sized(fired)} history", total=fired)
            if order == "sorted":
                await copy_tasks(dsn, count, first, DAY, partitions=partitions,
                                 progress=_advance(progress, pending_bar))
            else:
                await copy_rows(conn, scattered_rows(count, first, partitions), count,
                                progress=_advance(progress, pending_bar))
            if fired:
                history = history_rows(fired, first - DAY, partitions,
                                       scattered=order != "sorted")
                await copy_rows(conn, history, fired, columns=HISTORY_COLUMNS,
                                progress=_advance(progress, history_bar))
        copied = time.perf_counter()
        for statement in indexes:
            await conn.execute(statement)
        await conn.execute(f"CREATE INDEX {RUN_AT_INDEX} ON tasks (run_at)")
        indexed = time.perf_counter()
        await conn.execute("VACUUM (ANALYZE) tasks")
        vacuumed = time.perf_counter()
        fences = await conn.fetch(q("take_fences_local"), list(range(partitions)), "bench", "local")
        if len(fences) != partitions:
            raise BenchError(f"expected {partitions} partition fences, got {len(fences)}")
        await conn.execute("UPDATE partition_fences SET watermark = $1", bucket_of(first))
        sizes = await conn.fetchrow(
            "SELECT pg_relation_size('tasks') / 1048576.0 AS heap,"
            " pg_indexes_size('tasks') / 1048576.0 AS indexes"
        )
        assert sizes is not None
    finally:
        await conn.close()
    load = Load(
        pending=count, history=fired, copy_s=copied - started, index_s=indexed - copied,
        vacuum_s=vacuumed - indexed, table_mb=float(sizes["heap"]),
        indexes_mb=float(sizes["indexes"]),
    )
    return load, first + TICK_OFFSET


async def _drop_indexes(conn: asyncpg.Connection) -> list[str]:
    """Drop every index of ``tasks`` (primary key included); the statements that rebuild them."""
    pkey = await conn.fetchrow(
        "SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint"
        " WHERE conrelid = 'tasks'::regclass AND contype = 'p'"
    )
    rows = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
        " AND tablename = 'tasks'"
    )
    rebuild = []
    if pkey is not None:
        await conn.execute(f'ALTER TABLE tasks DROP CONSTRAINT "{pkey["conname"]}"')
        rebuild.append(f'ALTER TABLE tasks ADD CONSTRAINT "{pkey["conname"]}" {pkey["def"]}')
    for r in rows:
        if pkey is not None and r["indexname"] == pkey["conname"]:
            continue
        await conn.execute(f'DROP INDEX "{r["indexname"]}"')
        rebuild.append(r["indexdef"])
    return rebuild


def _stride(count: int) -> int:
    """A step coprime with ``count`` near 0.618 * count: ``i * step % count`` then visits every
    slot once, consecutive ``i`` far apart."""
    step = max(1, int(count * 0.6180339887))
    while math.gcd(step, count) != 1:
        step += 1
    return step


def scattered_rows(
    count: int, first: datetime, partitions: int, *, now: datetime | None = None
) -> Iterator[tuple[Any, ...]]:
    """``task_rows`` over [first, first + 1 day) in submission order, not run_at order.

    ``copy_tasks`` writes rows in run_at order, so the heap is perfectly correlated with
    run_at: a minute's due rows then share a few pages, which flatters every run_at index
    (and no table in service looks like that: tasks arrive in submission order). Here the
    i-th row gets the run_at slot ``i * stride % count``: the same run_at values, scattered.
    """
    run_at_at, bucket_at = COPY_COLUMNS.index("run_at"), COPY_COLUMNS.index("bucket")
    step, stride = DAY / count, _stride(count)
    rows = task_rows(count, first, DAY, now=now or first, partitions=partitions)
    for i, row in enumerate(rows):
        run_at = first + step * (i * stride % count)
        fields = list(row)
        fields[run_at_at], fields[bucket_at] = run_at, bucket_of(run_at)
        yield tuple(fields)


def history_rows(
    count: int, first: datetime, partitions: int, *, scattered: bool = True
) -> Iterator[tuple[Any, ...]]:
    """``count`` fired tasks (``HISTORY_COLUMNS``) over [first, first + 1 day): 1 % READY."""
    state_at = COPY_COLUMNS.index("state")
    run_at_at = COPY_COLUMNS.index("run_at")
    rows = (
        scattered_rows(count, first, partitions)
        if scattered
        else task_rows(count, first, DAY, now=first, partitions=partitions)
    )
    for i, row in enumerate(rows):
        run_at = row[run_at_at]
        state = TaskState.READY if i % 100 == 0 else TaskState.SUCCEEDED
        finished = run_at if state == TaskState.SUCCEEDED else None
        attempt = 1 if state == TaskState.SUCCEEDED else 0
        yield (*row[:state_at], int(state), *row[state_at + 1:], run_at, "bench", 1, finished,
               attempt)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    )


def _advance(progress: Progress, task: TaskID) -> Callable[[int], None]:
    return lambda n: progress.advance(task, n)


# ------------------------------------------------------------------------ measuring


def _strategy_keys(only: str | None) -> frozenset[str] | None:
    """The strategies ``only`` names (None: all); ValueError for a key no strategy has."""
    if only is None:
        return None
    keys = frozenset(k.strip() for k in only.split(",") if k.strip())
    known = {s.key for s in strategies()}
    if not keys or keys - known:
        raise ValueError(f"--only: choose from {', '.join(sorted(known))}, got {only!r}")
    return keys


async def _measure_all(
    dsn: str, load: Load, now: datetime, report: ScanReport, plans: Any, console: Console,
    keys: frozenset[str] | None = None,
) -> list[Measurement]:
    current = bucket_of(now, report.bucket_seconds)
    conn = await asyncpg.connect(dsn, server_settings={"timezone": "UTC"})
    try:
        fences = {r["partition"]: r["token"] for r in await conn.fetch(q("fences"))}
        top = await conn.fetchrow(
            "SELECT partition, count(*) AS due FROM tasks WHERE state = 0 AND bucket = $1"
            " AND run_at <= $2 GROUP BY partition ORDER BY count(*) DESC, partition LIMIT 1",
            current, now,
        )
        busiest, most = (top["partition"], top["due"]) if top is not None else (0, 0)
        scopes: dict[str, list[int]] = {
            "c": [busiest],
            "c2": [p for p in range(report.partitions) if p % report.nodes == 0],
            "c3": list(range(report.partitions)),
        }
        watermark = bucket_start(current, report.bucket_seconds)
        out = []
        for strategy in strategies():
            if keys is not None and strategy.key not in keys:
                continue
            if strategy.key in scopes:
                parts = scopes[strategy.key]
                args: tuple[Any, ...] = (parts, [fences[p] for p in parts], current, now,
                                         fire_limit(len(parts), most))
            elif strategy.key == "b2":
                parts, args = list(fences), (watermark, now)
            else:
                parts, args = list(fences), (now,)
            console.print(f"  {sized(load.pending):>5} {strategy.key:>3} {strategy.name} …",
                          end="")
            m, plan_text = await _measure(conn, strategy, args, load.pending, len(parts),
                                          report.repeats)
            console.print(f" {m.ms_per_tick:.3f} ms, {m.examined:,} rows examined")
            plans.write(_plan_section(strategy, load, args, plan_text))
            out.append(m)
        return out
    finally:
        await conn.close()


async def _measure(
    conn: asyncpg.Connection, strategy: Strategy, args: tuple[Any, ...], pending: int,
    partitions_scanned: int, repeats: int,
) -> tuple[Measurement, str]:
    """EXPLAIN it (text for people, JSON for figures), then time it, in the strategy's session.

    Each timed run is an ``EXPLAIN (ANALYZE, TIMING OFF)`` (server time, without per-node
    timing overhead or sending rows) followed by the statement itself (what a client waits).
    """
    async with strategy_session(conn, strategy):
        text_rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {strategy.sql}", *args)
        plan_text = "\n".join(r[0] for r in text_rows)
        explained = await explain_analyze(conn, strategy.sql, args)
        statement = await conn.prepare(strategy.sql)
        timer = await conn.prepare(
            f"EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON, FORMAT JSON) {strategy.sql}"
        )
        server_runs: list[float] = []
        client_runs: list[float] = []
        due = 0
        spent = 0.0
        while len(server_runs) < repeats and (not server_runs or spent < TIME_BUDGET_S):
            started = time.perf_counter()
            timed = json.loads(await timer.fetchval(*args))[0]
            server_runs.append(float(timed["Execution Time"]))
            between = time.perf_counter()
            due = len(await statement.fetch(*args))
            ended = time.perf_counter()
            client_runs.append((ended - between) * 1000)
            spent += ended - started
    ms = statistics.median(server_runs)
    return Measurement(
        strategy=strategy.key, name=strategy.name, pending=pending,
        partitions_scanned=partitions_scanned, due=due, examined=explained.examined,
        shared_hit=explained.shared_hit, shared_read=explained.shared_read,
        ms_per_tick=ms, ms_runs=server_runs, client_ms=statistics.median(client_runs),
        rows_per_s=explained.examined / (ms / 1000) if ms > 0 else 0.0, plan=explained.plan,
    ), plan_text


def _plan_section(strategy: Strategy, load: Load, args: tuple[Any, ...], plan: str) -> str:
    shown = [
        f"[{len(a)} values]" if isinstance(a, list) and len(a) > 4 else repr(a) for a in args
    ]
    setup = "; ".join(strategy.setup) or "(chronoq's schema, default planner settings)"
    return (
        f"\n{'=' * 100}\n{sized(load.pending)} pending + {sized(load.history)} history — "
        f"({strategy.key}) {strategy.name}: {strategy.note}\nsetup: {setup}\n"
        f"parameters: {', '.join(shown)}\n\n{strategy.sql}\n\n{plan}\n"
    )
