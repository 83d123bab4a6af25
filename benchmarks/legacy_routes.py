"""What the legacy routes cost a keyed submit: ``ShardedStore.submit_ids`` of ``--tasks`` keyed
tasks (fresh keys each run) over a map of two shards, with and without the probe.

Two databases of a throwaway embedded PostgreSQL (fsync off, one server), 256 partitions
split evenly. Layouts, run in turn ``--runs`` times each, medians printed:

- ``no probe``: the submit as it was before the routes (the probe replaced by a pass-through);
- ``probe, no routes``: no shard has entries (the common case: asked once per map version);
- ``probe, N routes``: each shard holds ``--routes`` entries, none of them for the submitted
  keys (one lookup statement per shard per submit);
- ``one shard``: a map with one shard holding every partition (no probe: its unique index
  decides), for reference.

A report, not a pass/fail test::

    python benchmarks/legacy_routes.py                  # 10,000 tasks, 100,000 routes, 5 runs
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.models import TaskSpec
from chronoq.shardmap import ShardMap
from chronoq.store import Store, legacy
from chronoq.store.sharded import ShardedStore

PARTITIONS = 256
HALF = PARTITIONS // 2
TWO = ShardMap(2, ("shard-0", "shard-1"), ("shard-0",) * HALF + ("shard-1",) * HALF)
ONE = ShardMap(2, ("shard-0", "shard-1"), ("shard-0",) * PARTITIONS)
#: The same split one version on: whether a shard has routes is asked once per map version.
LATER = ShardMap(3, TWO.shards, TWO.placement)


async def passthrough(
    store: Any,
    specs: Sequence[TaskSpec],
    partitions: Sequence[int],
    submit: Callable[[list[TaskSpec], list[int]], Awaitable[list[Any]]],
    answer: Any,
) -> list[Any]:
    return await submit(list(specs), list(partitions))


async def add_routes(store: Store, n: int) -> None:
    async with store.connection() as conn:
        await conn.execute(
            "INSERT INTO legacy_routes (id, partition, kind, namespace, key, row_partition)"
            " SELECT gen_random_uuid(), g % $2, 0, 'default', 'old-' || g, (g + 1) % $2"
            " FROM generate_series(1, $1) g",
            n,
            PARTITIONS,
        )
        await conn.execute("ANALYZE legacy_routes")


async def one_run(sharded: ShardedStore, n: int, now: datetime) -> float:
    tag = uuid.uuid4().hex[:8]
    specs = [TaskSpec(queue="q", run_at=now, idempotency_key=f"{tag}-{i}") for i in range(n)]
    started = time.perf_counter()
    await sharded.submit_ids(specs, now)
    return time.perf_counter() - started


async def measure(dsns: Sequence[str], tasks: int, routes: int, runs: int) -> None:
    stores = {
        f"shard-{i}": await Store.connect(dsn, partitions=PARTITIONS, max_size=4)
        for i, dsn in enumerate(dsns)
    }
    now = datetime.now(UTC)
    real = legacy.submit_routed
    timings: dict[str, list[float]] = {}
    try:
        layouts: list[tuple[str, ShardMap, bool]] = [
            ("no probe", TWO, False),
            ("probe, no routes", TWO, True),
            ("one shard", ONE, True),
        ]
        for round_ in range(2 * runs):
            if round_ == runs:
                for store in stores.values():
                    await add_routes(store, routes)
                layouts = [
                    ("no probe (same rounds)", LATER, False),
                    (f"probe, {routes:,} routes per shard", LATER, True),
                ]
            for name, shard_map, probing in layouts:
                sharded = ShardedStore(stores, lambda m=shard_map: m)  # type: ignore[misc]
                sharded.set_map(shard_map)
                legacy.submit_routed = real if probing else passthrough  # type: ignore[assignment]
                await one_run(sharded, 200, now)  # warm the statements
                timings.setdefault(name, []).append(await one_run(sharded, tasks, now))
    finally:
        legacy.submit_routed = real  # type: ignore[assignment]
        for store in stores.values():
            await store.close()
    print(f"submit_ids of {tasks:,} keyed tasks, two shards on one server (medians):")
    for name, seen in timings.items():
        print(f"  {name:<34} {statistics.median(seen) * 1000:7.1f} ms  ({len(seen)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--routes", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronoq-routes-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=False)
        server.start()
        try:
            dsns = (server.create_database("shard0"), server.create_database("shard1"))
            asyncio.run(measure(dsns, args.tasks, args.routes, args.runs))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
