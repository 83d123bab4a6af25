"""What a GIN index on tasks' labels would cost a batch submit: the store's ``submit_ids`` of
labelled tasks, without and with the index, beside unlabelled tasks with it.

Listings and bulk operations by label walk the namespace/state index (tasks_listing) and test
the labels on each row they read, a bounded stretch per statement (``chronoq.store.bulk``);
a GIN index (``jsonb_path_ops``, partial on ``labels IS NOT NULL``) would serve a rare label
without the walk, at a cost on every labelled insert. This measures that cost. Each
measurement is a fresh migrated database of one durable embedded PostgreSQL; the variants
alternate, so a slow minute of a shared machine lands on each alike. A report, not a test::

    python benchmarks/labels_index.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from chronoq.bench.raw import Databases
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.models import TaskSpec
from chronoq.store import Store

GIN = (
    "CREATE INDEX tasks_labels ON tasks USING gin (labels jsonb_path_ops) "
    "WHERE labels IS NOT NULL"
)
VARIANTS = ("labelled, no index", "labelled, GIN index", "unlabelled, GIN index")


def specs(count: int, labelled: bool) -> list[TaskSpec]:
    """Tasks due in an hour; labelled: three labels each, one of 1,000 customers."""
    at = datetime.now(UTC) + timedelta(hours=1)
    return [
        TaskSpec(
            queue="bench",
            run_at=at + timedelta(milliseconds=i),
            payload=b"x" * 64,
            labels=(("customer", f"c{i % 1000}"), ("env", "prod"), ("kind", "invoice"))
            if labelled
            else (),
        )
        for i in range(count)
    ]


async def measure(db: Databases, variant: str, tasks: int, batch: int) -> float:
    """Tasks per second of ``submit_ids`` in batches of ``batch`` on a fresh database."""
    async with db.fresh("labels") as dsn:
        if "GIN" in variant:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(GIN)
            finally:
                await conn.close()
        store = await Store.connect(dsn, min_size=1, max_size=2)
        try:
            todo = specs(tasks, labelled=variant.startswith("labelled"))
            await store.submit_ids(todo[:batch], datetime.now(UTC))  # warm: plans, caches
            started = time.perf_counter()
            for i in range(batch, len(todo), batch):
                await store.submit_ids(todo[i : i + batch], datetime.now(UTC))
            return (len(todo) - batch) / (time.perf_counter() - started)
        finally:
            await store.close()


async def run(dsn: str, args: argparse.Namespace) -> None:
    db = Databases(dsn, prefix="labels_index")
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(args.runs):
        print(f"run {i + 1} of {args.runs}", flush=True)
        for variant in VARIANTS:
            rate = await measure(db, variant, args.tasks, args.batch)
            rates[variant].append(rate)
            print(f"  {variant:<24} {rate:>9,.0f} tasks/s", flush=True)
    base = statistics.median(rates[VARIANTS[0]])
    print(f"medians of {args.runs} run(s), batches of {args.batch:,}:")
    for variant, got in rates.items():
        med = statistics.median(got)
        print(f"  {variant:<24} {med:>9,.0f} tasks/s   {med / base - 1:+6.1%} against no index")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per measurement")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="labels-index-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=True)
        server.start(timeout=120)
        try:
            print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
            asyncio.run(run(server.dsn, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
