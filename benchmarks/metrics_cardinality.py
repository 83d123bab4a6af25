"""What tenants' queue names cost /metrics: series, bytes, and another tenant's GetTask.

A node (in this process, metrics on) gets one task in each of ``--queues`` distinct queues of
one namespace; after a depth poll, /metrics is scraped once (series and bytes printed). Then
GetTask of another namespace's task is timed, alone and while ``--scrapers`` processes scrape
/metrics in a loop, as four Prometheus servers (or an attacker) would. A report, not a
pass/fail test::

    python benchmarks/metrics_cardinality.py                    # 100,000 queues, 4 scrapers
    python benchmarks/metrics_cardinality.py --queues 5000 --dsn postgresql://user@host/db
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta

from chronoq.client import Client, NewTask
from chronoq.config import NodeSettings
from chronoq.embedded.postgres import scratch_database
from chronoq.node import Node

BATCH = 10_000
CALLS = 400
SCRAPE_LOOP = """
import sys, urllib.request
url = sys.argv[1]
while True:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
    except OSError:
        pass
"""


def scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        return bytes(resp.read())


async def get_task_ms(client: Client, task_id: str, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        await client.get(task_id)
        out.append((time.perf_counter() - started) * 1000)
    return out


async def run(dsn: str, queues: int, scrapers: int) -> None:
    node = Node(NodeSettings(dsn=dsn, port=0, metrics_port=0))
    await node.start()
    try:
        later = datetime.now(UTC) + timedelta(minutes=10)
        async with Client(node.address, namespace="many", timeout=60) as many:
            for start in range(0, queues, BATCH):
                tasks = [
                    NewTask(queue=f"q{i}", run_at=later)
                    for i in range(start, min(queues, start + BATCH))
                ]
                await many.submit_ids(tasks)
        async with Client(node.address, namespace="quiet", timeout=60) as quiet:
            (submitted,) = await quiet.submit_many([NewTask(queue="q", run_at=later)])
            task_id = submitted.task.id
            assert node.depth is not None and node.metrics_port is not None
            await node.depth.poll()
            body = await asyncio.to_thread(scrape, node.metrics_port)
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
            print(f"queues {queues:,}: {series:,} series, {len(body):,} bytes of /metrics")
            await get_task_ms(quiet, task_id, 50)  # warm up
            alone = await get_task_ms(quiet, task_id, CALLS)
            url = f"http://127.0.0.1:{node.metrics_port}/metrics"
            loops = [
                await asyncio.create_subprocess_exec(sys.executable, "-c", SCRAPE_LOOP, url)
                for _ in range(scrapers)
            ]
            try:
                await asyncio.sleep(1)
                busy = await get_task_ms(quiet, task_id, CALLS)
            finally:
                for proc in loops:
                    proc.terminate()
                for proc in loops:
                    await asyncio.wait_for(proc.wait(), 10)
            renders = getattr(getattr(node.metrics, "page", None), "renders", None)
            print(
                f"GetTask p50 {statistics.median(alone):.1f} ms alone, "
                f"{statistics.median(busy):.1f} ms under {scrapers} scrape loops"
                + (f" ({renders} renders of /metrics)" if renders is not None else "")
            )
    finally:
        await node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--scrapers", type=int, default=4)
    parser.add_argument("--dsn", help="an empty scratch database (default: embedded)")
    args = parser.parse_args()
    with scratch_database("cardinality", args.dsn) as dsn:
        asyncio.run(run(dsn, args.queues, args.scrapers))


if __name__ == "__main__":
    main()
