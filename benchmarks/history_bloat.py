"""What retention leaves behind: finished tasks deleted row by row, against finished tasks
moved into the task history and dropped in whole time slices.

A "day" compressed: tasks go through their whole life at ``--rate`` per second
(submitted keyed and due at once, claimed, completed; one durable embedded
PostgreSQL, a fresh migrated database per mode) for ``--windows`` retention windows, for each
window of ``--retentions``. Mode ``delete`` keeps finished tasks in ``tasks`` and deletes those
past the retention in batches (the store's ``purge_finished``, what retention did before the
history); mode ``slices`` moves them into ``task_history`` after ``--after`` seconds
(``retire_finished``) and drops the slices (``--slices`` per window) whose time has passed
(``keep_history``). Both passes run every second beside the workload, as a node's retention
loop would. Every 5 s it samples each table's size (heap, indexes, TOAST), its dead tuples
and the WAL written, and prints the steady state (after the first retention window) and the
arithmetic for a week's retention at 4,000 tasks/s. A report, not a test::

    python benchmarks/history_bloat.py                   # 1,000/s; 60 s and 240 s kept
    python benchmarks/history_bloat.py --rate 2000 --retentions 120 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from chronoq.bench.raw import Databases, server_settings
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.models import Lease, TaskSpec, TaskState
from chronoq.store import Store

NS, QUEUE = "bench", "bloat"
PARTITIONS = 64
TICK_S = 0.25
SAMPLE_S = 5.0
BATCH = 5000

SIZES = """
SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint AS bytes,
       coalesce(sum(s.n_dead_tup), 0)::bigint AS dead,
       coalesce(sum(s.n_live_tup), 0)::bigint AS live,
       coalesce(sum(s.autovacuum_count + s.vacuum_count), 0)::bigint AS vacuums
FROM (SELECT $1::regclass AS relid
      UNION ALL SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf AND level > 0) t
LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid
"""


@dataclass
class Sample:
    at: float
    done: int
    tasks_bytes: int
    tasks_dead: int
    tasks_live: int
    history_bytes: int
    history_dead: int
    history_live: int
    wal: int
    vacuums: int


@dataclass
class Outcome:
    mode: str
    done: int = 0
    seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    retention_s: float = 0.0  # seconds spent in retention passes


async def workload(store: Store, rate: float, until: float, out: Outcome) -> None:
    """Submit, claim and complete ``rate`` tasks a second until ``until`` (monotonic)."""
    per_tick = max(1, round(rate * TICK_S))
    next_at = time.monotonic()
    while time.monotonic() < until:
        now = datetime.now(UTC)
        specs = [
            TaskSpec(namespace=NS, queue=QUEUE, run_at=now, idempotency_key=uuid.uuid4().hex)
            for _ in range(per_tick)
        ]
        await store.submit_ids(specs, now)
        claimed = await store.claim(NS, [QUEUE], "bench-worker", per_tick, datetime.now(UTC))
        if claimed:
            leases = [Lease(t.id, t.attempt) for t in claimed]
            await store.complete(NS, leases, datetime.now(UTC))
            out.done += len(claimed)
        next_at += TICK_S
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def retention(
    store: Store, args: argparse.Namespace, mode: str, until: float, out: Outcome
) -> None:
    """The node's retention pass once a second: row deletes, or the sweep and the slices."""
    parts = list(range(PARTITIONS))
    keep = timedelta(seconds=args.retention)
    width = timedelta(seconds=args.slice)
    last_upkeep = 0.0
    while time.monotonic() < until:
        started = time.perf_counter()
        now = datetime.now(UTC)
        if mode == "delete":
            while (
                await store.purge_finished(parts, [TaskState.SUCCEEDED], now - keep, BATCH) >= BATCH
            ):
                pass
        else:
            if time.monotonic() - last_upkeep >= SAMPLE_S:
                await store.keep_history(now, retention=keep, width=width)
                last_upkeep = time.monotonic()
            before = now - timedelta(seconds=args.after)
            while (
                await store.retire_finished(
                    parts, before, now, retention=keep, width=width, batch=BATCH
                )
            ).gone >= BATCH:
                pass
        out.retention_s += time.perf_counter() - started
        await asyncio.sleep(1.0)


async def sampler(
    conn: asyncpg.Connection, start_lsn: str, until: float, t0: float, out: Outcome
) -> None:
    while True:
        tasks = await conn.fetchrow(SIZES, "tasks")
        history = await conn.fetchrow(SIZES, "task_history")
        wal = await conn.fetchval(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint", start_lsn
        )
        out.samples.append(
            Sample(
                time.monotonic() - t0,
                out.done,
                tasks["bytes"],
                tasks["dead"],
                tasks["live"],
                history["bytes"],
                history["dead"],
                history["live"],
                wal,
                tasks["vacuums"] + history["vacuums"],
            )
        )
        if time.monotonic() >= until:
            return
        await asyncio.sleep(SAMPLE_S)


async def one_mode(db: Databases, mode: str, args: argparse.Namespace) -> Outcome:
    out = Outcome(mode)
    async with db.fresh(mode) as dsn:
        store = await Store.connect(dsn, partitions=PARTITIONS, min_size=3, max_size=4)
        conn = await asyncpg.connect(dsn)
        try:
            start_lsn = await conn.fetchval("SELECT pg_current_wal_lsn()::text")
            t0 = time.monotonic()
            until = t0 + args.seconds
            await asyncio.gather(
                workload(store, args.rate, until, out),
                retention(store, args, mode, until, out),
                sampler(conn, start_lsn, until, t0, out),
            )
            out.seconds = time.monotonic() - t0
        finally:
            await conn.close()
            await store.close()
    return out


def report(o: Outcome, args: argparse.Namespace) -> dict[str, float]:
    warm = args.retention + args.slice + SAMPLE_S
    steady = [s for s in o.samples if s.at >= warm] or o.samples[-1:]
    last = o.samples[-1]
    rate = o.done / o.seconds
    kept = rate * args.retention  # finished tasks the retention window holds
    total = [s.tasks_bytes + s.history_bytes for s in steady]
    figures = {
        "rate": rate,
        "tasks_mb": statistics.median(s.tasks_bytes for s in steady) / 2**20,
        "tasks_mb_max": max(s.tasks_bytes for s in steady) / 2**20,
        "history_mb": statistics.median(s.history_bytes for s in steady) / 2**20,
        "total_mb_max": max(total) / 2**20,
        "bytes_per_kept": statistics.median(total) / kept if kept else 0.0,
        "dead_max": max(s.tasks_dead for s in steady),
        "history_dead_max": max(s.history_dead for s in steady),
        "wal_per_task": last.wal / max(1, last.done),
        "retention_cpu_share": o.retention_s / o.seconds,
        "vacuums": last.vacuums,
    }
    print(
        f"  {o.mode:7} {rate:6,.0f}/s  tasks table {figures['tasks_mb']:6.1f} MB"
        f" (max {figures['tasks_mb_max']:6.1f}), dead tuples max {figures['dead_max']:>8,}"
        f"  | history {figures['history_mb']:6.1f} MB, dead max {figures['history_dead_max']:>6,}"
        f"  | together max {figures['total_mb_max']:6.1f} MB"
        f" = {figures['bytes_per_kept']:5.0f} B per task kept"
        f"  | WAL {figures['wal_per_task']:5.0f} B/task"
        f"  | retention passes {figures['retention_cpu_share']:.1%} of the time,"
        f" vacuums {figures['vacuums']}",
        flush=True,
    )
    return figures


async def run(dsn: str, args: argparse.Namespace) -> None:
    print(dict(await server_settings(dsn)))
    db = Databases(dsn, prefix="history_bloat")
    windows = [float(w) for w in args.retentions.split(",")]
    results: dict[tuple[float, str], list[dict[str, float]]] = {}
    for window in windows:
        one = argparse.Namespace(**vars(args))
        one.retention = window
        one.slice = window / args.slices
        one.seconds = window * args.windows
        print(
            f"\nretention {window:.0f} s (slices of {one.slice:.0f} s), {args.rate:,.0f} tasks/s"
            f" asked for {one.seconds:.0f} s, moved {args.after:.0f} s after their finish;"
            f" samples every {SAMPLE_S:.0f} s, steady state after the first window",
            flush=True,
        )
        for run_no in range(args.runs):
            for mode in ("delete", "slices") if run_no % 2 == 0 else ("slices", "delete"):
                fig = report(await one_mode(db, mode, one), one)
                results.setdefault((window, mode), []).append(fig)
    print(f"\nmedians of {args.runs} run(s) per window:")
    for (window, mode), figs in results.items():
        print(
            f"  {window:6.0f} s kept  {mode:7}"
            f" tasks table {statistics.median(f['tasks_mb'] for f in figs):7.1f} MB,"
            f" its dead tuples max {statistics.median(f['dead_max'] for f in figs):>9,.0f};"
            f" history {statistics.median(f['history_mb'] for f in figs):7.1f} MB,"
            f" its dead tuples max {statistics.median(f['history_dead_max'] for f in figs):>7,.0f};"
            f" {statistics.median(f['bytes_per_kept'] for f in figs):5.0f} B per task kept;"
            f" WAL {statistics.median(f['wal_per_task'] for f in figs):5.0f} B/task"
        )
    week = 4000 * 7 * 86400
    # autovacuum wakes for a table after 50 + 0.2 x its live rows dead ones (the defaults).
    print(
        f"  a week kept at 4,000 tasks/s is {week:,} finished tasks: deleted row by row from"
        f" tasks, autovacuum's default trigger lets {50 + 0.2 * week:,.0f} dead tuples pile up"
        " there before it runs; retired into the history, tasks holds only what is live (its"
        " dead tuples follow the churn between two autovacuum runs, whatever the retention)"
        " and the history none (its slices are dropped whole)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="tasks per second")
    parser.add_argument(
        "--retentions", default="60,240", help="retention windows to run, seconds, comma-separated"
    )
    parser.add_argument("--windows", type=float, default=2.5, help="each run lasts this many")
    parser.add_argument("--slices", type=int, default=6, help="history slices per window")
    parser.add_argument(
        "--after",
        type=float,
        default=0.0,
        help="seconds a finished task stays in tasks before the sweep",
    )
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="history-bloat-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=True)
        server.start(timeout=120)
        try:
            print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
            asyncio.run(run(server.dsn, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
