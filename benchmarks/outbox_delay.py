"""Outbox delay: how late a task reaches chronoq after the application's transaction commits.

A producer commits one outbox row per transaction (``chronoq.outbox.enqueue`` on asyncpg)
into an application database at ``--rate`` per second for ``--seconds``; one relay process
(``chronoq outbox relay``) moves them to a node in a child process; both databases live on
one durable embedded PostgreSQL (or ``--dsn``). Every process shares the machine's clock. The
delay of a row is its task's ``created_at`` in chronoq's store (the node's insert) minus the
instant its ``COMMIT`` returned to the producer. A report, not a pass/fail test::

    python benchmarks/outbox_delay.py                    # 1,000/s for 20 s
    python benchmarks/outbox_delay.py --rate 200 --seconds 10 --relays 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from chronoq.bench.raw import Databases, dsn_with_database
from chronoq.bench.throughput.children import Child
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.outbox import enqueue, migrate
from chronoq.stats import percentile

QUEUE = "outbox-delay"
#: Seconds after the last commit for its task to reach chronoq.
DRAIN_S = 10.0


async def produce(app_dsn: str, rate: float, seconds: float, connections: int) -> dict[str, float]:
    """Commit ``rate * seconds`` rows, paced from the start; the commit instant of each key."""
    conns = [await asyncpg.connect(app_dsn) for _ in range(connections)]
    free: asyncio.Queue[asyncpg.Connection] = asyncio.Queue()
    for c in conns:
        free.put_nowait(c)
    committed: dict[str, float] = {}

    async def one(i: int) -> None:
        conn = await free.get()
        try:
            async with conn.transaction():
                key = await enqueue(conn, QUEUE, payload={"i": i})
            committed[key] = time.time()
        finally:
            free.put_nowait(conn)

    count = round(rate * seconds)
    started = time.perf_counter()
    pending: set[asyncio.Task[None]] = set()
    for i in range(count):
        pause = started + i / rate - time.perf_counter()
        if pause > 0:
            await asyncio.sleep(pause)
        t = asyncio.create_task(one(i))
        pending.add(t)
        t.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    took = time.perf_counter() - started
    print(f"  committed {count} rows in {took:.1f} s ({count / took:.0f}/s)", flush=True)
    for c in conns:
        await c.close()
    return committed


async def arrivals(store_dsn: str) -> dict[str, float]:
    conn = await asyncpg.connect(store_dsn)
    try:
        rows = await conn.fetch(
            "SELECT idempotency_key, extract(epoch FROM created_at) AS at FROM tasks_with_history "
            "WHERE queue = $1",
            QUEUE,
        )
    finally:
        await conn.close()
    return {r["idempotency_key"]: float(r["at"]) for r in rows}


async def run(args: argparse.Namespace, admin_dsn: str, logs: Path) -> None:
    db = Databases(admin_dsn, prefix="outbox")
    app_name = f"outbox_app_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{app_name}"')
    app_dsn = dsn_with_database(admin_dsn, app_name)
    try:
        await migrate(app_dsn)
        async with db.fresh("store") as store_dsn:
            node = await Child.spawn_node("node-outbox", store_dsn, logs)
            relays: list[asyncio.subprocess.Process] = []
            try:
                for i in range(args.relays):
                    with (logs / f"relay-{i}.log").open("wb") as log:
                        relays.append(await asyncio.create_subprocess_exec(
                            sys.executable, "-m", "chronoq.cli", "--log-level", "info", "outbox",
                            "relay", "--dsn", app_dsn, "--address", node.info,
                            stdout=log, stderr=subprocess.STDOUT,
                        ))  # fmt: skip
                await asyncio.sleep(2.0)  # listening
                committed = await produce(app_dsn, args.rate, args.seconds, args.connections)
                deadline = time.monotonic() + DRAIN_S
                while time.monotonic() < deadline:
                    arrived = await arrivals(store_dsn)
                    if len(arrived) >= len(committed):
                        break
                    await asyncio.sleep(0.5)
            finally:
                for proc in relays:
                    proc.terminate()
                for proc in relays:
                    await asyncio.wait_for(proc.wait(), 30)
                await node.stop()
            arrived = await arrivals(store_dsn)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{app_name}" WITH (FORCE)')
        await admin.close()
    delays = sorted((arrived[k] - t) * 1e3 for k, t in committed.items() if k in arrived)
    print(
        f"{len(delays)}/{len(committed)} tasks arrived; commit -> task p50 "
        f"{percentile(delays, 50):.1f} ms, p90 {percentile(delays, 90):.1f}, p99 "
        f"{percentile(delays, 99):.1f}, max {delays[-1] if delays else 0.0:.1f} "
        f"({args.relays} relay(s), {args.rate:.0f}/s for {args.seconds:.0f} s)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--relays", type=int, default=1)
    parser.add_argument(
        "--connections", type=int, default=8, help="the producer's (a commit waits for fsync)"
    )
    parser.add_argument("--dsn", help="a server whose role may CREATE DATABASE (else embedded)")
    parser.add_argument("--logs", type=Path, help="keep the node's and relays' logs here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="outbox-") as tmp:
        logs = args.logs or Path(tmp) / "logs"
        logs.mkdir(exist_ok=True)
        server = None
        if args.dsn is None:
            server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=True)
            server.start(timeout=120)
        try:
            print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
            asyncio.run(run(args, args.dsn or server.dsn, logs))
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
