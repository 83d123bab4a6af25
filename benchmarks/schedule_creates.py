"""Schedule creates through a store of shards: latency of one create, with the namespace cap on.

Two databases of a throwaway embedded PostgreSQL (fsync off, one server), three layouts:

- ``bare store``: ``Schedules`` on one ``Store`` (no store of shards at all);
- ``one shard``: a map with one shard holding every partition (calls go straight through);
- ``two shards``: a map of two shards; the namespace's cap and quota are counted on
  ``shard-0`` (take, create on the schedule's shard, drop the take).

``--creates`` creates of distinct names by ``--clients`` concurrent callers, each with a cap
and a quota, then as many deletes. Printed per layout: median and p99 latency of a create and
of a delete. A report, not a pass/fail test::

    python benchmarks/schedule_creates.py                 # 2,000 creates, 1 client
    python benchmarks/schedule_creates.py --clients 4
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.models import ScheduleSpec
from chronoq.recurrence import Every
from chronoq.shardmap import ShardMap
from chronoq.store import Store
from chronoq.store.schedules import Schedules
from chronoq.store.sharded import ShardedSchedules, ShardedStore

PARTITIONS = 256
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def layouts() -> dict[str, ShardMap | None]:
    half = PARTITIONS // 2
    return {
        "bare store": None,
        "one shard": ShardMap(1, ("shard-0",), ("shard-0",) * PARTITIONS),
        "two shards": ShardMap(
            1, ("shard-0", "shard-1"), ("shard-0",) * half + ("shard-1",) * half
        ),
    }


def spec(i: int) -> ScheduleSpec:
    return ScheduleSpec(name=f"s{i:06d}", queue="q", rule=Every(timedelta(minutes=1), NOW))


async def timed(n: int, clients: int, call: Callable[[int], Awaitable[object]]) -> list[float]:
    """Seconds of each of ``n`` calls, ``clients`` at a time."""
    took: list[float] = []
    next_i = iter(range(n))

    async def client() -> None:
        for i in next_i:
            t = time.perf_counter()
            await call(i)
            took.append(time.perf_counter() - t)

    await asyncio.gather(*(client() for _ in range(clients)))
    return took


def figures(took: list[float]) -> str:
    ms = sorted(t * 1000 for t in took)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"median {statistics.median(ms):6.2f} ms  p99 {p99:6.2f} ms"


async def measure(s: Schedules | ShardedSchedules, creates: int, clients: int) -> str:
    """Figures of ``creates`` capped creates, then their deletes."""
    made = await timed(
        creates, clients, lambda i: s.create(spec(i), NOW, cap=creates + 1, quota=1e9)
    )
    gone = await timed(creates, clients, lambda i: s.delete("default", spec(i).name, NOW))
    return f"create {figures(made)}   delete {figures(gone)}"


async def run(dsns: tuple[str, str], creates: int, clients: int) -> None:
    for label, shard_map in layouts().items():
        stores: dict[str, Store] = {}
        try:
            names = ("shard-0",) if shard_map is None else shard_map.shards
            for shard, dsn in zip(names, dsns, strict=False):
                stores[shard] = await Store.connect(
                    dsn, partitions=PARTITIONS, max_size=clients + 2
                )
                async with stores[shard].connection() as conn:
                    await conn.execute("TRUNCATE schedules")
            schedules: Schedules | ShardedSchedules
            if shard_map is None:
                schedules = Schedules(stores["shard-0"])
            else:
                m = shard_map
                sharded = ShardedStore(stores, lambda m=m: m)  # type: ignore[misc]
                sharded.set_map(shard_map)
                schedules = ShardedSchedules(sharded)
            print(f"{label:12s} {await measure(schedules, creates, clients)}")
        finally:
            for store in stores.values():
                await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronoq-schedules-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=False)
        server.start()
        try:
            dsns = (server.create_database("shard0"), server.create_database("shard1"))
            asyncio.run(run(dsns, args.creates, args.clients))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
