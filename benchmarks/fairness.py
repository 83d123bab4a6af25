"""Fair firing across namespaces: one namespace's flood against another's single task.

A node with default settings (system clock, 100 ms tick, 256 partitions, fire batch 5,000)
owns every partition. ``--flood`` tasks of namespace ``flood`` and then one task of namespace
``quiet`` all come due at the same instant. ``fired_at`` is the tick's ``now``, shared by every
statement of a tick, so it cannot show the order within a tick: a watcher polls the store
instead and notes when the quiet task turned READY and when the last flood task did. Printed
per run: the quiet task's lateness (seen READY - run_at), the time to fire the whole flood and
the flood's fire rate. ``--backfill`` measures the cost of sharing where lanes are many and
thin instead: tasks of 20 namespaces due over three hours of buckets, fired at once after a
clock jump. A report, not a pass/fail test::

    python benchmarks/fairness.py                 # embedded PostgreSQL in a temporary directory
    python benchmarks/fairness.py --runs 3 --flood 50000
    python benchmarks/fairness.py --backfill
    python benchmarks/fairness.py --dsn postgresql://user@host/db   # an empty, scratch database
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chronoq.buckets import bucket_of, partition_of
from chronoq.clock import ManualClock
from chronoq.config import NodeSettings
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.models import TaskSpec
from chronoq.node import Node
from chronoq.store import Store

#: Time to load the flood before it comes due; a run whose load took longer is reported as such.
LEAD = timedelta(seconds=30)
#: The backfill measure: tasks due over this long, all fired at once.
BACKFILL_SPREAD = timedelta(hours=3)
_COLUMNS = (
    "id", "namespace", "queue", "partition", "bucket", "run_at", "state", "max_attempts",
    "backoff_initial_ms", "backoff_max_ms", "lease_timeout_ms", "misfire_grace_ms", "created_at",
)  # fmt: skip
#: How often the watcher reads the quiet task's state, and looks for flood tasks left.
WATCH_EVERY = 0.002
WATCH_FLOOD_EVERY = 0.05


async def one_run(dsn: str, flood: int) -> dict[str, float]:
    """Load, let the node fire everything, and read the figures from the store."""
    store = await Store.connect(dsn, min_size=1, max_size=2)
    node = Node(NodeSettings(dsn=dsn, port=0))
    await node.start()
    try:
        due = datetime.now(UTC) + LEAD
        await copy_flood(store, flood, due)
        (quiet,) = await store.submit(
            [TaskSpec(queue="q", namespace="quiet", run_at=due)], datetime.now(UTC)
        )
        if datetime.now(UTC) >= due:
            raise SystemExit("loading took longer than the lead time; raise LEAD")
        quiet_seen, flood_done = await watch(store, due, quiet.task.id)
    finally:
        await node.stop(grace=1)
        await store.close()
    return {
        "quiet_late_s": quiet_seen,
        "flood_all_fired_s": flood_done,
        "flood_rate_per_s": flood / flood_done if flood_done > 0 else float("inf"),
    }


async def copy_flood(store: Store, count: int, run_at: datetime) -> None:
    """``count`` SCHEDULED tasks of namespace ``flood`` due at ``run_at``, by COPY (fast)."""
    rows = []
    for _ in range(count):
        task_id = uuid.uuid4()
        rows.append(
            (
                task_id, "flood", "q", partition_of(task_id.bytes, store.partitions),
                bucket_of(run_at, store.bucket_seconds), run_at, 0, 3, 1000, 60_000, 30_000,
                60_000, datetime.now(UTC),
            )
        )  # fmt: skip
    async with store.connection() as conn:
        await conn.copy_records_to_table("tasks", records=rows, columns=_COLUMNS)
        await conn.execute("ANALYZE tasks")


async def watch(store: Store, due: datetime, quiet_id: str) -> tuple[float, float]:
    """Seconds after ``due`` at which the quiet task was seen READY, and no flood task was left
    SCHEDULED (to within the polling period)."""
    quiet_seen = flood_done = None
    deadline = time.monotonic() + LEAD.total_seconds() + 600
    next_flood_look = 0.0
    async with store.connection() as conn:
        while time.monotonic() < deadline and (quiet_seen is None or flood_done is None):
            await asyncio.sleep(WATCH_EVERY if quiet_seen is None else WATCH_FLOOD_EVERY)
            now = datetime.now(UTC)
            if now < due:
                continue
            after = (now - due).total_seconds()
            if quiet_seen is None:
                state = await conn.fetchval(
                    "SELECT state FROM tasks_with_history WHERE id = $1", quiet_id
                )
                if state != 0:
                    quiet_seen = after
            if flood_done is None and after >= next_flood_look:
                next_flood_look = after + WATCH_FLOOD_EVERY
                left = await conn.fetchval(
                    "SELECT 1 FROM tasks WHERE state = 0 AND namespace = 'flood' LIMIT 1"
                )
                if left is None:
                    flood_done = (datetime.now(UTC) - due).total_seconds()
    if quiet_seen is None or flood_done is None:
        raise SystemExit("the tasks did not fire in time")
    return quiet_seen, flood_done


async def backfill_run(dsn: str, count: int) -> dict[str, float]:
    """Throughput where lanes are many and thin: ``count`` tasks of 20 namespaces due over the
    next three hours, then the clock jumps four hours (a node back from downtime)."""
    clock = ManualClock(datetime.now(UTC))
    store = await Store.connect(dsn, min_size=1, max_size=2)
    node = Node(NodeSettings(dsn=dsn, port=0), clock=clock)
    await node.start()
    try:
        start = clock.now() + timedelta(minutes=1)
        rows = []
        for i in range(count):
            task_id = uuid.uuid4()
            run_at = start + BACKFILL_SPREAD * (i / count)
            rows.append(
                (
                    task_id, f"ns{i % 20}", "q", partition_of(task_id.bytes, store.partitions),
                    bucket_of(run_at, store.bucket_seconds), run_at, 0, 3, 1000, 60_000,
                    30_000, 60_000 * 600, clock.now(),
                )
            )  # fmt: skip
        async with store.connection() as conn:
            await conn.copy_records_to_table("tasks", records=rows, columns=_COLUMNS)
            await conn.execute("ANALYZE tasks")
        await asyncio.sleep(0.5)  # the first ticks take the fences; nothing is due yet
        clock.advance(BACKFILL_SPREAD + timedelta(hours=1))
        started = time.monotonic()
        assert node.firer is not None
        node.firer.poke()
        async with store.connection() as conn:
            while await conn.fetchval("SELECT 1 FROM tasks WHERE state = 0 LIMIT 1"):
                if time.monotonic() - started > 600:
                    raise SystemExit("the backfill did not finish in 10 minutes")
                await asyncio.sleep(0.05)
        seconds = time.monotonic() - started
    finally:
        await node.stop(grace=1)
        await store.close()
    return {"backfill_s": seconds, "backfill_rate_per_s": count / seconds}


async def run(dsn: str | None, runs: int, flood: int, backfill: bool) -> None:
    results = []
    with tempfile.TemporaryDirectory(prefix="chronoq-fairness-") as tmp:
        server = None
        if dsn is None:
            server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=False)
            server.start()
        try:
            for i in range(runs):
                if server is not None:
                    url = server.create_database(f"fairness_{i}")
                else:
                    assert dsn is not None
                    url = dsn
                if backfill:
                    figures = await backfill_run(url, flood)
                    results.append(figures)
                    print(
                        f"run {i + 1}: backfill of {flood} tasks over 180 one-minute buckets and"
                        f" 20 namespaces: {figures['backfill_s']:.1f} s "
                        f"({figures['backfill_rate_per_s']:,.0f} tasks/s)",
                        flush=True,
                    )
                    continue
                figures = await one_run(url, flood)
                results.append(figures)
                print(
                    f"run {i + 1}: quiet task READY {figures['quiet_late_s'] * 1000:.0f} ms "
                    f"after run_at; whole flood fired after "
                    f"{figures['flood_all_fired_s'] * 1000:.0f} ms "
                    f"({figures['flood_rate_per_s']:,.0f} tasks/s)",
                    flush=True,
                )
                if dsn is not None:
                    break  # one run per scratch database
        finally:
            if server is not None:
                server.stop()
    if len(results) > 1:
        for key in results[0]:
            print(f"median {key}: {statistics.median(r[key] for r in results):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="an empty scratch database (default: embedded)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flood", type=int, default=50_000, help="tasks of the flooding namespace")
    parser.add_argument(
        "--backfill",
        action="store_true",
        help="measure throughput on many thin lanes instead: --flood tasks of 20 namespaces over"
        " three hours of buckets, fired at once after a clock jump",
    )
    args = parser.parse_args()
    asyncio.run(run(args.dsn, args.runs, args.flood, args.backfill))


if __name__ == "__main__":
    main()
