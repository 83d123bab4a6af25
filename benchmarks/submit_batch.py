"""One client's batch submit beside the raw insert ceiling and PgQueuer's batch enqueue.

Each run measures, in turn and each on a fresh database of one durable embedded PostgreSQL:

- raw insert: chronoq's own ``insert_task_ids`` through asyncpg on one connection, batches of
  ``--batch``, prepared, keyless and keyed (an idempotency key per row, as the SDK gives every
  task): the ceiling of the store's statement, no node, no validation;
- chronoq: one ``Client`` calling ``submit_ids`` with ``--batch`` tasks at a time, one call
  after the other, to a node in a child process (validation, routing, idempotency and the
  answer included); then the same list in one ``submit_ids`` call, which the SDK sends in
  requests of 1,000 tasks with three in flight;
- PgQueuer (with ``--pgqueuer-python``, an interpreter that has ``pgqueuer``: a scratch
  virtual environment, never chronoq's): ``Queries.enqueue`` of ``--batch`` jobs at a time,
  one statement per batch, without and with dedupe keys (``benchmarks/peers``).

Printed per run: tasks/s and CPU per task of this process (the client), the node and the
PostgreSQL server; then the medians, and the median of each run's own ratio of chronoq to
every other figure. Runs alternate, so a slow minute of a shared machine lands on every
figure of its run alike. A report, not a pass/fail test::

    python benchmarks/submit_batch.py --runs 3
    python -m venv /tmp/pgq && /tmp/pgq/bin/pip install pgqueuer asyncpg
    python benchmarks/submit_batch.py --runs 3 --pgqueuer-python /tmp/pgq/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from chronoq.bench.raw import Databases, insert_ceiling
from chronoq.bench.throughput.children import Child
from chronoq.bench.throughput.measure import cpu_now
from chronoq.bench.throughput.submit import spread_tasks, submit_all
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.redact import split_password

PEER = Path(__file__).with_name("peers") / "pgqueuer_enqueue.py"
CHRONOQ = "chronoq submit_ids, 1 client"
CHRONOQ_WHOLE = "chronoq, 1 call, parts in flight"
#: Seconds for the server to reap a closed connection's backend (its CPU counts once reaped).
REAPED_S = 0.3


#: CPU seconds so far of (this process, the other process measured, the PostgreSQL server).
Cpu = tuple[float, float, float]


class Bench:
    def __init__(self, admin_dsn: str, postgres: int | None, args: argparse.Namespace) -> None:
        self.db = Databases(admin_dsn, prefix="submit_batch")
        self.postgres = postgres
        self.args = args
        self.logs = Path(args.logs)
        self.results: dict[str, list[dict[str, float]]] = {}

    def cpu(self, pids: list[int]) -> Cpu:
        return cpu_now(pids, self.postgres)

    async def measured(
        self, name: str, job: Callable[[str], Awaitable[tuple[float, Cpu, Cpu]]]
    ) -> None:
        """``job(dsn)`` on a fresh database: the seconds its tasks took, and the CPU
        readings before and after them."""
        tasks = self.args.tasks
        async with self.db.fresh(name.split(",")[0].replace(" ", "_")) as dsn:
            seconds, before, after = await job(dsn)
        client, other, server = ((b - a) * 1e6 / tasks for a, b in zip(before, after, strict=True))
        row = {"per_s": tasks / seconds, "client_us": client, "other_us": other, "pg_us": server}
        self.results.setdefault(name, []).append(row)
        print(
            f"  {name:<34} {row['per_s']:>9,.0f} tasks/s   CPU per task: client {client:5.1f} µs,"
            f" node {other:5.1f} µs, PostgreSQL {server:5.1f} µs",
            flush=True,
        )

    async def raw(self, keyed: bool) -> None:
        async def job(dsn: str) -> tuple[float, Cpu, Cpu]:
            before = self.cpu([])
            rate = await insert_ceiling(dsn, self.args.tasks, batch=self.args.batch, keyed=keyed)
            await asyncio.sleep(REAPED_S)
            return self.args.tasks / rate, before, self.cpu([])

        await self.measured(f"raw insert, 1 conn, {'keyed' if keyed else 'keyless'}", job)

    async def chronoq(self, whole: bool) -> None:
        """``whole``: the list in one ``submit_ids`` call, which the SDK sends in requests of
        ``SUBMIT_PART`` tasks, three in flight; else one call per ``--batch`` tasks."""

        async def job(dsn: str) -> tuple[float, Cpu, Cpu]:
            tasks = spread_tasks(self.args.tasks, timedelta(hours=1))
            warm = spread_tasks(self.args.batch, timedelta(hours=1))
            node = await Child.spawn_node("node-submit-batch", dsn, self.logs)
            try:
                await submit_all(node.info, warm, 1, batch=self.args.batch)
                before = self.cpu([node.pid])
                batch = len(tasks) if whole else self.args.batch
                seconds = await submit_all(node.info, tasks, 1, batch=batch)
                return seconds, before, self.cpu([node.pid])
            finally:
                await node.stop()

        await self.measured(CHRONOQ_WHOLE if whole else CHRONOQ, job)

    async def pgqueuer(self, keyed: bool) -> None:
        python = self.args.pgqueuer_python

        async def job(dsn: str) -> tuple[float, Cpu, Cpu]:
            bare, password = split_password(dsn)
            cmd = [
                python,
                str(PEER),
                "--dsn",
                bare,
                "--tasks",
                str(self.args.tasks),
                "--batch",
                str(self.args.batch),
                *(["--keyed"] if keyed else []),
            ]
            env = {**os.environ, **({"PGPASSWORD": password} if password else {})}
            before = self.cpu([])
            done = await asyncio.to_thread(
                subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=600
            )
            await asyncio.sleep(REAPED_S)
            after = self.cpu([])
            if done.returncode != 0:
                raise RuntimeError(f"PgQueuer's enqueue failed:\n{done.stderr[-2000:]}")
            out = json.loads(done.stdout.strip().splitlines()[-1])
            # Its client is a child process: its own CPU reading, in the client column. The
            # server's figure includes the schema install (a few ms).
            return (
                float(out["seconds"]),
                (0.0, 0.0, before[2]),
                (float(out["cpu_seconds"]), 0.0, after[2]),
            )

        await self.measured(f"PgQueuer enqueue, {'dedupe keys' if keyed else 'no keys'}", job)

    async def run(self) -> None:
        for i in range(self.args.runs):
            print(f"run {i + 1} of {self.args.runs}", flush=True)
            await self.raw(keyed=False)
            await self.raw(keyed=True)
            await self.chronoq(whole=False)
            await self.chronoq(whole=True)
            if self.args.pgqueuer_python:
                await self.pgqueuer(keyed=False)
                await self.pgqueuer(keyed=True)

    def summary(self) -> dict[str, Any]:
        print(f"medians of {self.args.runs} run(s), batches of {self.args.batch:,}:")
        out: dict[str, Any] = {}
        for name, rows in self.results.items():
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            # Each run's own ratio, then their median: a slow minute of a shared machine
            # moves a run's figures together, so its ratios are steadier than its rates.
            per_call, whole = (
                statistics.median(
                    c["per_s"] / r["per_s"] for c, r in zip(self.results[mine], rows, strict=True)
                )
                for mine in (CHRONOQ, CHRONOQ_WHOLE)
            )
            out[name] = {"median": med, "runs": rows, "ratios": [per_call, whole]}
            print(
                f"  {name:<34} {med['per_s']:>9,.0f} tasks/s   chronoq (per call, 1 call) / "
                f"this {per_call:5.0%} {whole:5.0%}   CPU per task: client {med['client_us']:5.1f}"
                f", node {med['other_us']:5.1f}, PostgreSQL {med['pg_us']:5.1f} µs"
            )
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per measurement")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dsn", help="a server whose role may CREATE DATABASE (else embedded)")
    parser.add_argument(
        "--pgqueuer-python",
        default=os.environ.get("CHRONOQ_BENCH_PGQUEUER_PYTHON"),
        help="an interpreter with pgqueuer installed (env CHRONOQ_BENCH_PGQUEUER_PYTHON)",
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="submit-batch-") as tmp:
        args.logs = Path(tmp) / "logs"
        args.logs.mkdir()
        server = None
        if args.dsn is None:
            server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=True)
            server.start(timeout=120)
        try:
            bench = Bench(args.dsn or server.dsn, server.pid if server else None, args)
            print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
            asyncio.run(bench.run())
            summary = bench.summary()
        finally:
            if server is not None:
                server.stop()
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
