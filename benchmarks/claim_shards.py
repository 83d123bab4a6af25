"""Claims through a store of shards: latency, tasks/s, and attempts spent on tasks no worker got.

Two databases of a throwaway embedded PostgreSQL (fsync off, one server: the shards share
its cores), three layouts of the same ``--tasks`` READY tasks of one queue:

- ``one shard``: a map with one shard holding every partition (calls go straight through);
- ``two shards, ready on one``: a map of two shards, every ready task on ``shard-0``;
- ``two shards, ready on both``: the tasks spread over both shards' partitions.

``--workers`` claimers each claim ``--batch`` at a time until the queue is empty. Printed per
layout: median and p99 claim latency, tasks/s, and attempts burned (the attempt numbers of all
claimed tasks minus the number of claims that handed each out: a task claimed by a worker
has attempt 1, a task handed out after being given back has more). A report, not a
pass/fail test::

    python benchmarks/claim_shards.py                     # 20,000 tasks, 4 workers x 10
    python benchmarks/claim_shards.py --tasks 50000 --batch 50
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.models import TaskSpec, TaskState
from chronoq.shardmap import ShardMap
from chronoq.store import Store
from chronoq.store.sharded import ShardedStore

PARTITIONS = 256
QUEUE = "bench"


def layouts() -> dict[str, ShardMap]:
    half = PARTITIONS // 2
    return {
        "one shard": ShardMap(1, ("shard-0",), ("shard-0",) * PARTITIONS),
        "two shards, ready on one": ShardMap(
            1, ("shard-0", "shard-1"), ("shard-0",) * half + ("shard-1",) * half
        ),
        "two shards, ready on both": ShardMap(
            1, ("shard-0", "shard-1"), ("shard-0",) * half + ("shard-1",) * half
        ),
    }


async def load(store: Store, n: int, partitions: Sequence[int], now: datetime) -> None:
    """``n`` READY tasks (due now), their partitions drawn in turn from ``partitions``."""
    for at in range(0, n, 1000):
        k = min(1000, n - at)
        specs = [
            TaskSpec(queue=QUEUE, run_at=now, priority=(at + i) % 5, payload=b"x" * 64)
            for i in range(k)
        ]
        parts = [partitions[(at + i) % len(partitions)] for i in range(k)]
        await store.submit_ids(specs, now, partitions=parts)


async def drain(
    sharded: ShardedStore, workers: int, batch: int, now: datetime
) -> tuple[list[float], int, int, float]:
    latencies: list[float] = []
    claimed = 0
    attempts = 0

    async def worker(i: int) -> None:
        nonlocal claimed, attempts
        while True:
            started = time.perf_counter()
            got = await sharded.claim("default", [QUEUE], f"w{i}", batch, now)
            latencies.append(time.perf_counter() - started)
            if not got:
                return
            claimed += len(got)
            attempts += sum(t.attempt for t in got)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return latencies, claimed, attempts, time.perf_counter() - started


async def run(dsns: tuple[str, str], tasks: int, workers: int, batch: int) -> None:
    now = datetime.now(UTC) + timedelta(seconds=1)
    for name, shard_map in layouts().items():
        stores: dict[str, Store] = {}
        try:
            for shard, dsn in zip(shard_map.shards, dsns, strict=False):
                stores[shard] = await Store.connect(
                    dsn, partitions=PARTITIONS, max_size=workers + 2
                )
                async with stores[shard].connection() as conn:
                    await conn.execute("TRUNCATE tasks")
            sharded = ShardedStore(stores, lambda m=shard_map: m)
            sharded.set_map(shard_map)
            if name == "two shards, ready on both":
                for shard in shard_map.shards:
                    await load(stores[shard], tasks // 2, shard_map.held_by(shard), now)
            else:
                await load(stores["shard-0"], tasks, shard_map.held_by("shard-0"), now)
            for store in stores.values():
                async with store.connection() as conn:
                    await conn.execute("ANALYZE tasks")
            lat, claimed, attempts, seconds = await drain(sharded, workers, batch, now)
            counts = await sharded.count_by_state()
            lat.sort()
            print(
                f"{name:28s} claim median {statistics.median(lat) * 1000:6.2f} ms, "
                f"p99 {lat[int(len(lat) * 0.99)] * 1000:6.2f} ms, "
                f"{claimed / seconds:8,.0f} tasks/s, {claimed:,} claimed, "
                f"attempts burned {attempts - claimed:,}, "
                f"left READY {counts.get(TaskState.READY, 0):,}"
            )
        finally:
            for store in stores.values():
                await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10, help="max_tasks per claim")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronoq-claims-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=False)
        server.start()
        try:
            dsns = (server.create_database("shard0"), server.create_database("shard1"))
            asyncio.run(run(dsns, args.tasks, args.workers, args.batch))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
