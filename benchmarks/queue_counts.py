"""What the kept queue counts cost at a large backlog: an owner's recount of its partitions,
and a QueueCounts call's reads, beside the bounded CountTasks statement and an exact scan.

Loads ``--tasks`` pending tasks (default 1,000,000: 90% scheduled, 8% ready, 1% running, 1%
dead, over ``--queues`` queues and 256 partitions) into a fresh migrated database of one
durable embedded PostgreSQL, vacuums it (as autovacuum would: index-only scans need the
visibility map), then times each read several times and prints medians. With ``--submit`` it
also measures what the recount's index costs a batch submit (alternating with and without
it). A report, not a test::

    python benchmarks/queue_counts.py --tasks 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from chronoq.bench.raw import Databases
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.limits import MAX_COUNTED_QUEUES, MAX_COUNTED_TASKS, MAX_KEPT_QUEUES
from chronoq.models import TaskSpec, TaskState
from chronoq.node.queue_counts import LIVE_BATCH, LIVE_STATES, RECOUNT_BATCH
from chronoq.queuecounts import KEPT_STATES, snapshot
from chronoq.store import Store

PARTITIONS = 256
LOAD = """
INSERT INTO tasks (id, namespace, queue, partition, bucket, run_at, state, max_attempts,
                   backoff_initial_ms, backoff_max_ms, lease_timeout_ms, misfire_grace_ms,
                   created_at)
SELECT gen_random_uuid(), 'bench', 'q' || (i % $3), (i % 256)::smallint,
       (extract(epoch FROM $1::timestamptz)::bigint / 60) + i % 1440,
       $1::timestamptz + (i % 86400) * interval '1 second',
       CASE WHEN i % 100 < 90 THEN 0 WHEN i % 100 < 98 THEN 1 WHEN i % 100 < 99 THEN 2
            ELSE 4 END,
       3, 1000, 60000, 30000, 0, $1
FROM generate_series($2::bigint, $2::bigint + $4 - 1) AS i
"""


async def timed(call: Callable[[], Awaitable[Any]], runs: int) -> float:
    """The median seconds of ``runs`` calls (after one to warm plans and caches)."""
    await call()
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        await call()
        took.append(time.perf_counter() - started)
    return statistics.median(took)


async def load(dsn: str, tasks: int, queues: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        now = datetime.now(UTC) + timedelta(hours=1)
        step = 200_000
        for start in range(0, tasks, step):
            await conn.execute(LOAD, now, start, queues, min(step, tasks - start))
            print(f"  loaded {min(tasks, start + step):,}", flush=True)
        await conn.execute("VACUUM (ANALYZE) tasks")
    finally:
        await conn.close()


async def reads(dsn: str, args: argparse.Namespace) -> None:
    store = await Store.connect(dsn, min_size=1, max_size=2)
    try:
        everything = list(range(PARTITIONS))
        batches = [everything[i : i + RECOUNT_BATCH] for i in range(0, PARTITIONS, RECOUNT_BATCH)]
        now = datetime.now(UTC)

        async def recount_all() -> None:
            for batch in batches:
                await store.recount_queues(batch, now, "bench", max_queues=MAX_KEPT_QUEUES)

        async def recount_live() -> None:
            for i in range(0, PARTITIONS, LIVE_BATCH):
                await store.recount_queues(
                    everything[i : i + LIVE_BATCH],
                    now,
                    "bench",
                    max_queues=MAX_KEPT_QUEUES,
                    states=LIVE_STATES,
                )

        async def recount_one_batch() -> None:
            await store.recount_queues(batches[0], now, "bench", max_queues=MAX_KEPT_QUEUES)

        async def kept() -> None:
            counts = await store.kept_counts("bench", None, max_queues=MAX_KEPT_QUEUES)
            snapshot(counts, now=now, partitions=PARTITIONS, max_queues=MAX_KEPT_QUEUES)

        async def kept_one_queue() -> None:
            await store.kept_counts("bench", ["q1"], max_queues=MAX_KEPT_QUEUES)

        async def count_tasks() -> None:
            await store.queue_counts(
                "bench",
                list(KEPT_STATES),
                max_tasks=MAX_COUNTED_TASKS,
                max_queues=MAX_COUNTED_QUEUES,
            )

        async def exact_scan() -> None:
            async with store.connection() as conn:
                await conn.fetch(
                    "SELECT queue, state, count(*) FROM tasks WHERE namespace = 'bench'"
                    " AND state IN (0, 1, 2, 4) GROUP BY queue, state"
                )

        runs = args.runs
        whole = await timed(recount_all, max(1, runs // 3))
        one = await timed(recount_one_batch, runs)
        live = await timed(recount_live, max(1, runs // 3))
        rpc = await timed(kept, runs)
        rpc_one = await timed(kept_one_queue, runs)
        old = await timed(count_tasks, runs)
        scan = await timed(exact_scan, max(1, runs // 3))
        counts = await store.kept_counts("bench", None, max_queues=MAX_KEPT_QUEUES)
        per_state = {s.name: counts.totals.get(s, 0) for s in TaskState if s in counts.totals}
        n = args.tasks
        print(f"\n{n:,} pending tasks, {args.queues} queues, {PARTITIONS} partitions: {per_state}")
        print(
            f"  recount of every partition ({len(batches)} statements of {RECOUNT_BATCH}):"
            f" {whole * 1000:9.1f} ms   ({n / whole / 1e6:.2f} M index entries/s)"
        )
        print(f"  recount of READY and RUNNING alone, every partition: {live * 1000:9.1f} ms")
        print(
            f"  recount of one statement ({RECOUNT_BATCH} partitions):"
            f"           {one * 1000:9.1f} ms"
        )
        print(f"  QueueCounts reads, every queue:              {rpc * 1000:9.2f} ms")
        print(f"  QueueCounts reads, one named queue:          {rpc_one * 1000:9.2f} ms")
        print(
            f"  CountTasks statement (lower bounds at {MAX_COUNTED_TASKS:,}/state):"
            f" {old * 1000:9.1f} ms"
        )
        print(f"  exact count of the table's index:            {scan * 1000:9.1f} ms")
        scale = 10_000_000 / n
        print(
            f"  at 10M pending (linear): a recount of every partition ~{whole * scale:.1f} s;"
            f" at the loop's 5% share the counts are ~{whole * scale / 0.05:.0f} s stale"
            " at worst on a node owning every partition (READY/RUNNING: as their own count grows);"
            " QueueCounts unchanged (it reads partitions x queues rows)"
        )
    finally:
        await store.close()


async def submit_rate(db: Databases, with_index: bool, tasks: int) -> float:
    async with db.fresh("submit") as dsn:
        if not with_index:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("DROP INDEX tasks_partition_states")
            finally:
                await conn.close()
        store = await Store.connect(dsn, min_size=1, max_size=2)
        try:
            at = datetime.now(UTC) + timedelta(hours=1)
            specs = [TaskSpec(queue=f"q{i % 20}", run_at=at) for i in range(tasks)]
            await store.submit_ids(specs[:1000], datetime.now(UTC))
            started = time.perf_counter()
            for i in range(1000, tasks, 1000):
                await store.submit_ids(specs[i : i + 1000], datetime.now(UTC))
            return (tasks - 1000) / (time.perf_counter() - started)
        finally:
            await store.close()


async def run(dsn: str, args: argparse.Namespace) -> None:
    db = Databases(dsn, prefix="queue_counts")
    async with db.fresh("counts") as fresh:
        print(f"loading {args.tasks:,} tasks", flush=True)
        started = time.perf_counter()
        await load(fresh, args.tasks, args.queues)
        print(f"  {time.perf_counter() - started:.0f} s", flush=True)
        await reads(fresh, args)
    if args.submit:
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.submit_runs):
            for with_index in (False, True):
                rates[with_index].append(await submit_rate(db, with_index, args.submit))
        without, with_ = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"  batch submit without the recount's index: {without:9,.0f} tasks/s")
        print(
            f"  batch submit with it:                     {with_:9,.0f} tasks/s"
            f"  ({with_ / without - 1:+.1%})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000, help="pending tasks loaded")
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--runs", type=int, default=9, help="timed calls per read")
    parser.add_argument("--submit", type=int, default=0, help="tasks per submit measurement")
    parser.add_argument("--submit-runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="queue-counts-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=True)
        server.start(timeout=120)
        try:
            print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
            asyncio.run(run(server.dsn, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
