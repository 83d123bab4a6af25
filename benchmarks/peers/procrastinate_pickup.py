"""Procrastinate's immediate pickup, for ``benchmarks/pickup.py`` to run beside chronoq.

Runs in an interpreter that has ``procrastinate`` and ``psycopg`` (a scratch virtual
environment, never chronoq's own: procrastinate is no dependency of chronoq). The shape of
chronoq's run: installs procrastinate's schema in the database it is given, starts
``--workers`` worker processes (this script with ``--worker``, ``--concurrency`` jobs each,
LISTEN/NOTIFY on, as procrastinate's default), then one client defers single jobs at
``--rate`` per second for ``--seconds``, each carrying the client's clock just before its
``defer_async``; the no-op task notes how long after that its start came. Prints one JSON
line: ``starts`` and ``calls`` (seconds, sorted). The password comes from ``PGPASSWORD``,
not the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from procrastinate import App, PsycopgConnector

#: Seconds the workers get to connect and LISTEN before the first defer.
SETTLE_S = 2.0
#: Seconds after the last defer for its job to start.
DRAIN_S = 2.0
QUEUE = "bench"


def make_app(dsn: str) -> tuple[App, list[float]]:
    app = App(connector=PsycopgConnector(conninfo=dsn))
    starts: list[float] = []

    @app.task(queue=QUEUE, name="noop")
    async def noop(t: float) -> None:
        starts.append(time.time() - t)

    return app, starts


async def worker(dsn: str, concurrency: int, out: Path) -> None:
    app, starts = make_app(dsn)
    async with app.open_async():
        # Runs until SIGTERM (procrastinate's own signal handlers stop it gracefully).
        await app.run_worker_async(queues=[QUEUE], concurrency=concurrency, wait=True)
    await asyncio.to_thread(out.write_text, json.dumps(starts))


async def client(args: argparse.Namespace) -> dict[str, list[float]]:
    app, _ = make_app(args.dsn)
    outs = [Path(args.tmp) / f"worker-{i}.json" for i in range(args.workers)]
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 (started once, before the clock)
                [sys.executable, __file__, "--dsn", args.dsn, "--worker",
                 "--concurrency", str(args.concurrency), "--out", str(out)]
            )
            for out in outs
        ]  # fmt: skip
        try:
            await asyncio.sleep(SETTLE_S)
            noop = app.tasks["noop"]
            calls: list[float] = []
            count = round(args.rate * args.seconds)
            started = time.perf_counter()
            for i in range(count):
                pause = started + i / args.rate - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
                t0 = time.perf_counter()
                await noop.defer_async(t=time.time())
                calls.append(time.perf_counter() - t0)
            await asyncio.sleep(DRAIN_S)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
    starts = sorted(s for out in outs if out.exists() for s in json.loads(out.read_text()))
    return {"starts": starts, "calls": sorted(calls)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tmp", default=os.environ.get("TMPDIR", "/tmp"))
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.dsn, args.concurrency, args.out))
    else:
        print(json.dumps(asyncio.run(client(args))))


if __name__ == "__main__":
    main()
