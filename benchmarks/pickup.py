"""Immediate pickup: how soon a task due at once starts after its submit.

The shape of a PostgreSQL job-queue harness: one client submits single tasks due at once
(``run_at`` = the client's clock just before the call) at ``--rate`` per second for
``--seconds``, and ``--workers`` worker processes (``--concurrency`` handlers each, no-op
handlers that note their start) take them from a node in a child process, on a durable
embedded PostgreSQL. Every process shares the machine's clock. Printed per run and as
medians: submit → handler start p50 / p90 / p99 / max, the submit call alone (until the
node answered it accepted), and the median of each leg of a start from the task's own
instants: the call to the insert's ``now`` (``created_at``), that to the claim's ``now``
(the lease's start), and that to the handler. A report, not a pass/fail test.

Beside it in the same run, on the same server: the raw floor, one connection inserting one
task due at once per commit at the same rate (``insert_task_ids``), then claiming it with the
claim statement (a second commit), as a queue without a service in between does; and, with
``--procrastinate-python`` (an interpreter that has ``procrastinate`` and ``psycopg``: a
scratch virtual environment, never chronoq's own), procrastinate in the same shape
(``benchmarks/peers/procrastinate_pickup.py``)::

    python benchmarks/pickup.py                      # 200/s for 10 s, 4 workers, 3 runs
    python benchmarks/pickup.py --rate 50 --runs 5
    python -m venv /tmp/procr && /tmp/procr/bin/pip install procrastinate 'psycopg[binary]'
    python benchmarks/pickup.py --procrastinate-python /tmp/procr/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from chronoq.bench.raw import Databases, _insert_columns
from chronoq.bench.throughput.children import Child
from chronoq.client import Client
from chronoq.diagnostics.task_rows import NAMESPACE, PAYLOAD, QUEUE, task_rows
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.limits import MAX_ANSWER_BYTES, TASK_FIXED_BYTES, Limits
from chronoq.models import TaskState
from chronoq.redact import split_password
from chronoq.stats import percentile
from chronoq.store.sql import q

#: Seconds the workers get to open their streams before the first submit.
SETTLE_S = 1.0
#: Seconds after the last submit for its handler to start.
DRAIN_S = 2.0
PEER = Path(__file__).with_name("peers") / "procrastinate_pickup.py"


async def one_run(args: argparse.Namespace, db: Databases, logs: Path) -> dict[str, float]:
    async with db.fresh("pickup") as dsn:
        node = await Child.spawn_node("node-pickup", dsn, logs)
        workers: list[Child] = []
        try:
            workers = list(await asyncio.gather(*(
                Child.spawn(f"worker-{i}", ["worker", "--address", node.info, "--concurrency",
                            str(args.concurrency), "--id", f"pickup-{i}"], logs)
                for i in range(args.workers)
            )))  # fmt: skip
            await asyncio.sleep(SETTLE_S)
            calls: list[float] = []
            async with Client(node.info) as client:
                await client.wait_ready()
                count = round(args.rate * args.seconds)
                started = time.perf_counter()
                for i in range(count):
                    # Paced from the start, not from the previous call: a slow call is not
                    # followed by a gap.
                    pause = started + i / args.rate - time.perf_counter()
                    if pause > 0:
                        await asyncio.sleep(pause)
                    t0 = time.perf_counter()
                    await client.submit(QUEUE, run_at=datetime.now(UTC), payload=PAYLOAD)
                    calls.append(time.perf_counter() - t0)
            await asyncio.sleep(DRAIN_S)
        finally:
            stats = [await w.stop() for w in workers]
            await node.stop()
        steps = legs([leg for st in stats for leg in st.get("start_legs", [])])
    starts = sorted(s * 1e3 for st in stats for s in st.get("start_lateness", []))
    calls_ms = sorted(c * 1e3 for c in calls)
    row = {
        "tasks": float(count),
        "started": float(len(starts)),
        "p50_ms": percentile(starts, 50),
        "p90_ms": percentile(starts, 90),
        "p99_ms": percentile(starts, 99),
        "max_ms": starts[-1] if starts else 0.0,
        "submit_p50_ms": percentile(calls_ms, 50),
        "submit_p99_ms": percentile(calls_ms, 99),
        **steps,
    }
    print(
        f"  {int(row['started'])}/{count} started; submit -> start p50 {row['p50_ms']:.1f} ms, "
        f"p90 {row['p90_ms']:.1f}, p99 {row['p99_ms']:.1f}, max {row['max_ms']:.1f}; "
        f"the submit call p50 {row['submit_p50_ms']:.1f} ms, p99 {row['submit_p99_ms']:.1f}; "
        f"p50 legs: call -> insert {row['inserted_p50_ms']:.1f} ms, insert -> claim "
        f"{row['claimed_p50_ms']:.1f} ms, claim -> start (claim statement, push, worker) "
        f"{row['started_p50_ms']:.1f} ms",
        flush=True,
    )
    return row


def legs(starts: list[list[float]]) -> dict[str, float]:
    """Medians of each leg of a start (see ``handler_legs``), in ms."""
    names = ("inserted_p50_ms", "claimed_p50_ms", "started_p50_ms")
    return {
        name: statistics.median(leg[i] for leg in starts) * 1e3 if starts else 0.0
        for i, name in enumerate(names)
    }


async def raw_floor(args: argparse.Namespace, db: Databases) -> dict[str, float]:
    """One connection, no service: insert one READY task due now (one commit), then claim it
    (a second commit), paced at ``--rate``; per task the insert alone and insert + claim."""
    limits = Limits()
    ms = timedelta(milliseconds=1)
    bounds = (limits.min_lease_timeout // ms, limits.max_lease_timeout // ms)
    count = round(args.rate * args.seconds)
    inserts: list[float] = []
    both: list[float] = []
    async with db.fresh("raw") as dsn:
        conn = await asyncpg.connect(dsn, server_settings={"timezone": "UTC"})
        try:
            insert = await conn.prepare(q("insert_task_ids"))
            claim = await conn.prepare(q("claim"))
            started = time.perf_counter()
            for i in range(count):
                pause = started + i / args.rate - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
                t0 = time.perf_counter()
                now = datetime.now(UTC)
                row = list(next(task_rows(1, now, timedelta(0), now=now)))
                row[6] = int(TaskState.READY)
                await insert.fetch(*_insert_columns([tuple(row)]), now)
                t1 = time.perf_counter()
                got = await claim.fetch(NAMESPACE, [QUEUE], 1, "raw", now, [1], *bounds,
                                        MAX_ANSWER_BYTES, TASK_FIXED_BYTES)  # fmt: skip
                t2 = time.perf_counter()
                if len(got) != 1:
                    raise RuntimeError("the raw claim took nothing")
                inserts.append((t1 - t0) * 1e3)
                both.append((t2 - t0) * 1e3)
        finally:
            await conn.close()
    inserts.sort()
    both.sort()
    row_ = {
        "raw_insert_p50_ms": percentile(inserts, 50),
        "raw_both_p50_ms": percentile(both, 50),
        "raw_both_p99_ms": percentile(both, 99),
    }
    print(f"  raw floor: insert (one commit) p50 {row_['raw_insert_p50_ms']:.2f} ms; insert + "
          f"claim (two commits) p50 {row_['raw_both_p50_ms']:.2f} ms, p99 "
          f"{row_['raw_both_p99_ms']:.2f}", flush=True)  # fmt: skip
    return row_


async def procrastinate(args: argparse.Namespace, db: Databases) -> dict[str, float]:
    """The peer in the same shape, in its own interpreter (see the module's docstring)."""
    async with db.fresh("procrastinate") as dsn:
        bare, password = split_password(dsn)
        with tempfile.TemporaryDirectory(prefix="pickup-peer-") as tmp:
            cmd = [
                args.procrastinate_python,
                str(PEER),
                "--dsn",
                bare,
                "--rate",
                str(args.rate),
                "--seconds",
                str(args.seconds),
                "--workers",
                str(args.workers),
                "--concurrency",
                str(args.concurrency),
                "--tmp",
                tmp,
            ]
            env = {**os.environ, **({"PGPASSWORD": password} if password else {})}
            done = await asyncio.to_thread(
                subprocess.run, cmd, env=env, capture_output=True, text=True,
                timeout=args.seconds + 120,
            )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"procrastinate's run failed:\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    starts = [s * 1e3 for s in out["starts"]]
    calls = [c * 1e3 for c in out["calls"]]
    row = {
        "peer_p50_ms": percentile(starts, 50),
        "peer_p90_ms": percentile(starts, 90),
        "peer_p99_ms": percentile(starts, 99),
        "peer_call_p50_ms": percentile(calls, 50),
    }
    print(f"  procrastinate: {len(starts)}/{round(args.rate * args.seconds)} started; defer -> "
          f"start p50 {row['peer_p50_ms']:.1f} ms, p90 {row['peer_p90_ms']:.1f}, p99 "
          f"{row['peer_p99_ms']:.1f}; the defer call p50 {row['peer_call_p50_ms']:.1f} ms",
          flush=True)  # fmt: skip
    return row


async def run(args: argparse.Namespace, admin_dsn: str, logs: Path) -> None:
    db = Databases(admin_dsn, prefix="pickup")
    rows = []
    for i in range(args.runs):
        print(
            f"run {i + 1} of {args.runs} ({args.rate}/s for {args.seconds} s, "
            f"{args.workers} workers x {args.concurrency}; load average "
            f"{os.getloadavg()[0]:.1f})",
            flush=True,
        )
        row = await one_run(args, db, logs)
        row.update(await raw_floor(args, db))
        if args.procrastinate_python:
            row.update(await procrastinate(args, db))
        rows.append(row)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(
        f"medians of {args.runs}: submit -> start p50 {med['p50_ms']:.1f} ms, p90 "
        f"{med['p90_ms']:.1f}, p99 {med['p99_ms']:.1f}; submit call p50 "
        f"{med['submit_p50_ms']:.1f} ms; legs p50 {med['inserted_p50_ms']:.1f} / "
        f"{med['claimed_p50_ms']:.1f} / {med['started_p50_ms']:.1f} ms; raw insert "
        f"{med['raw_insert_p50_ms']:.2f} ms, insert + claim {med['raw_both_p50_ms']:.2f} ms"
    )
    if args.procrastinate_python:
        print(f"  procrastinate: defer -> start p50 {med['peer_p50_ms']:.1f} ms, p90 "
              f"{med['peer_p90_ms']:.1f}, p99 {med['peer_p99_ms']:.1f}; defer call p50 "
              f"{med['peer_call_p50_ms']:.1f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dsn", help="a server whose role may CREATE DATABASE (else embedded)")
    parser.add_argument(
        "--procrastinate-python",
        default=os.environ.get("CHRONOQ_BENCH_PROCRASTINATE_PYTHON"),
        help="an interpreter with procrastinate installed (env CHRONOQ_BENCH_PROCRASTINATE_PYTHON)",
    )
    parser.add_argument("--logs", type=Path, help="keep the node's and workers' logs here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pickup-") as tmp:
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
