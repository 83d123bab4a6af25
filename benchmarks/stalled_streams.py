"""Node memory under worker streams that never read: the reproduction of issue 23's finding.

A node (its own process, so its RSS is its own) on an embedded PostgreSQL holds ``--tasks``
READY tasks of ``--payload`` bytes; ``--streams`` raw ``Work`` streams (one connection each)
open with ``--credits`` credits and never read. Printed: the node's RSS before the streams,
its peak while they are open (``--seconds``), the tasks by state after, and the RSS once the
streams are gone. A report, not a pass/fail test::

    python benchmarks/stalled_streams.py                          # 10 streams, 400 x 256 KiB
    python benchmarks/stalled_streams.py --streams 256 --tasks 20000 --payload 1024
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from chronoq.api.v1 import worker_pb2, worker_pb2_grpc
from chronoq.client import Client, NewTask
from chronoq.embedded.postgres import scratch_database

STATES = {0: "SCHEDULED", 1: "READY", 2: "RUNNING", 3: "SUCCEEDED"}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def load(address: str, tasks: int, payload: int) -> None:
    async with Client(address, timeout=60) as client:
        chunk = max(1, min(1000, (2 * 1024 * 1024) // max(payload, 1)))
        for start in range(0, tasks, chunk):
            n = min(chunk, tasks - start)
            await client.submit_ids([NewTask(queue="stall", payload=b"x" * payload)] * n)


async def states(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT state, count(*) AS n FROM tasks_with_history GROUP BY state"
        )
    finally:
        await conn.close()
    return {STATES.get(r["state"], str(r["state"])): r["n"] for r in rows}


async def stall(address: str, pid: int, streams: int, credits: int, seconds: float) -> float:
    channels = [grpc.aio.insecure_channel(address) for _ in range(streams)]
    calls: list[Any] = []
    for channel in channels:
        call = worker_pb2_grpc.WorkerServiceStub(channel).Work()  # type: ignore[no-untyped-call]
        await call.write(
            worker_pb2.WorkRequest(
                open=worker_pb2.WorkOpen(queues=["stall"], worker_id="sleeper"), credits=credits
            )
        )
        calls.append(call)
    peak = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, rss_mb(pid))
        await asyncio.sleep(0.25)
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()
    return peak


async def run(args: argparse.Namespace, dsn: str) -> None:
    port = free_port()
    env = {**os.environ, "CHRONOQ_DSN": dsn, "CHRONOQ_PORT": str(port)}
    node = subprocess.Popen(  # noqa: ASYNC220 - the node runs for the whole report
        [sys.executable, "-m", "chronoq.cli", "node"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    address = f"127.0.0.1:{port}"
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            await asyncio.sleep(0.1)
        await load(address, args.tasks, args.payload)
        stored = args.tasks * args.payload / 1e6
        base = rss_mb(node.pid)
        print(f"{args.tasks} tasks x {args.payload} B ({stored:.0f} MB stored)")
        print(f"node RSS before the streams: {base:.0f} MB")
        peak = await stall(address, node.pid, args.streams, args.credits, args.seconds)
        print(f"node RSS peak with {args.streams} non-reading streams: {peak:.0f} MB")
        print(f"  per stream: {(peak - base) / args.streams:.1f} MB")
        await asyncio.sleep(2)
        print(f"tasks after: {await states(dsn)}")
        print(f"node RSS after the streams closed: {rss_mb(node.pid):.0f} MB")
    finally:
        node.terminate()
        node.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--payload", type=int, default=256 * 1024)
    parser.add_argument("--credits", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    with scratch_database("stall") as dsn:
        asyncio.run(run(args, dsn))


if __name__ == "__main__":
    main()
