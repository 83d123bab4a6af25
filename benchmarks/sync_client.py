"""What the blocking ``SyncClient`` costs over the async ``Client``, per single-task submit.

A node runs in this process on a loop of its own thread, on an embedded PostgreSQL (not
durable). Then, in turn: the async client submitting one task at a time from a loop; the
``SyncClient`` submitting one at a time from one thread (each call hops to its private loop
thread and back); the ``SyncClient`` shared by ``--threads`` threads. Per phase: submits per
second and the p50/p99 latency of one submit. Everything shares this process's GIL, node
included, so compare phases of one run, not runs on different machines. A report, not a
pass/fail test::

    python benchmarks/sync_client.py                 # 2,000 submits per phase, 8 threads
    python benchmarks/sync_client.py --submits 5000 --threads 16
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from chronoq.client import Client, SyncClient
from chronoq.config import NodeSettings
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.node import Node
from chronoq.stats import percentile

QUEUE = "bench-sync"


def report(name: str, latencies: list[float], wall: float) -> None:
    ms = sorted(x * 1000 for x in latencies)
    print(
        f"{name:<34} {len(ms) / wall:>8,.0f} submits/s   p50 {percentile(ms, 50):6.2f} ms"
        f"   p99 {percentile(ms, 99):6.2f} ms",
        flush=True,
    )


async def async_phase(address: str, submits: int) -> None:
    async with Client(address) as client:
        latencies = []
        started = time.perf_counter()
        for i in range(submits):
            t0 = time.perf_counter()
            await client.submit(QUEUE, payload={"i": i})
            latencies.append(time.perf_counter() - t0)
        report("async Client, one loop", latencies, time.perf_counter() - started)


def sync_phase(client: SyncClient, submits: int, threads: int) -> None:
    def one_thread(n: int) -> list[float]:
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            client.submit(QUEUE, payload={"i": i})
            out.append(time.perf_counter() - t0)
        return out

    per_thread = submits // threads
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(one_thread, [per_thread] * threads))
    wall = time.perf_counter() - started
    report(f"SyncClient, {threads} thread(s)", [x for r in results for x in r], wall)


def main(submits: int, threads: int) -> None:
    with tempfile.TemporaryDirectory(prefix="chronoq-sync-bench-") as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pgdata", durable=False)
        pg.start()
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_forever, name="node", daemon=True)
        runner.start()
        node = Node(NodeSettings(dsn=pg.create_database("sync_bench"), port=0))
        try:
            asyncio.run_coroutine_threadsafe(node.start(), loop).result(60)
            asyncio.run(async_phase(node.address, submits))
            with SyncClient(node.address) as client:
                sync_phase(client, submits, 1)
                sync_phase(client, submits, threads)
        finally:
            asyncio.run_coroutine_threadsafe(node.stop(grace=1), loop).result(60)
            loop.call_soon_threadsafe(loop.stop)
            runner.join(10)
            pg.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    main(args.submits, args.threads)
