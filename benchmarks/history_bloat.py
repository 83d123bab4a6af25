"""What retention leaves behind: finished tasks deleted row by row, against finished tasks
moved into the task history and dropped in whole time slices.

A "day" compressed: tasks go through their whole life at ``--rate`` per second for
``--seconds`` (submitted keyed and due at once, claimed, completed; one durable embedded
PostgreSQL, a fresh migrated database per mode), with a retention of ``--retention`` seconds,
several windows in all. Mode ``delete`` keeps finished tasks in ``tasks`` and deletes those
past the retention in batches (the store's ``purge_finished``, what retention did before the
history); mode ``slices`` moves them into ``task_history`` after ``--after`` seconds
(``retire_finished``) and drops the slices of ``--slice`` seconds whose time has passed
(``keep_history``). Both passes run every second beside the workload, as a node's retention
loop would. Every 5 s it samples each table's size (heap, indexes, TOAST), its dead tuples
and the WAL written, and prints the steady state (after the first retention window) and the
arithmetic for a week's retention at 4,000 tasks/s. A report, not a test::

    python benchmarks/history_bloat.py                            # 1,000/s, 240 s, 60 s kept
    python benchmarks/history_bloat.py --rate 2000 --seconds 400 --retention 100 --slice 20
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
    steady = [s for s in o.samples if s.at >= args.retention + args.slice + SAMPLE_S] or o.samples[
        -1:
    ]
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
        "wal_per_task": last.wal / max(1, last.done),
        "retention_cpu_share": o.retention_s / o.seconds,
        "vacuums": last.vacuums,
    }
    print(
        f"  {o.mode:7} {rate:8,.0f} tasks/s done   tasks table {figures['tasks_mb']:7.1f} MB"
        f" (max {figures['tasks_mb_max']:.1f})   history {figures['history_mb']:7.1f} MB"
        f"   together max {figures['total_mb_max']:7.1f} MB"
        f" = {figures['bytes_per_kept']:6.0f} B per task kept"
        f"   dead tuples max {figures['dead_max']:>9,}   WAL {figures['wal_per_task']:6.0f}"
        f" B/task   retention {figures['retention_cpu_share']:.1%} of the time"
        f"   vacuums {figures['vacuums']}",
        flush=True,
    )
    return figures


async def run(dsn: str, args: argparse.Namespace) -> None:
    print({k: v for k, v in (await server_settings(dsn)).items()})
    print(
        f"{args.rate:,.0f} tasks/s asked for {args.seconds:.0f} s,"
        f" retention {args.retention:.0f} s,"
        f" slices of {args.slice:.0f} s, moved {args.after:.0f} s after their finish;"
        f" samples every {SAMPLE_S:.0f} s, steady state after the first window"
    )
    db = Databases(dsn, prefix="history_bloat")
    results: dict[str, list[dict[str, float]]] = {"delete": [], "slices": []}
    for run_no in range(args.runs):
        print(f"run {run_no + 1}/{args.runs}", flush=True)
        for mode in ("delete", "slices") if run_no % 2 == 0 else ("slices", "delete"):
            results[mode].append(report(await one_mode(db, mode, args), args))
    week = 4000 * 7 * 86400
    print(f"\nmedians of {args.runs} run(s); a week's retention at 4,000 tasks/s ({week:,} tasks):")
    for mode, figs in results.items():
        per = statistics.median(f["bytes_per_kept"] for f in figs)
        dead = statistics.median(f["dead_max"] for f in figs)
        wal = statistics.median(f["wal_per_task"] for f in figs)
        print(
            f"  {mode:7} {per:6.0f} B per task kept -> {per * week / 2**30:8,.0f} GiB;"
            f" dead tuples max here {dead:>9,.0f}; WAL {wal:6.0f} B/task"
        )
    # autovacuum wakes for a table after 50 + 0.2 x its live rows dead ones (the defaults).
    print(
        f"  autovacuum's default trigger on a table of a week's finished tasks: "
        f"{50 + 0.2 * week:,.0f} dead tuples before it runs (delete mode: every purged row"
        " is one); the history leaves none: it drops its slices whole"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="tasks per second")
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--retention", type=float, default=60.0, help="seconds kept")
    parser.add_argument("--slice", type=float, default=10.0, help="history slice, seconds")
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
