"""Phase shards: for each store shard count, a local stack whose store is that many servers.

Each count gets its own ``DevStack`` (``store_shards`` N: shard-0 .. shard-N-1, each its own
durable embedded PostgreSQL, the map split evenly; ``SHARD_NODES`` node processes on an etcd,
alike for every count), and on it:

1. submit: ``tasks`` tasks due an hour ahead, one client, batches of ``SUBMIT_BATCH``;
   each server's task count (its share) and its CPU meanwhile;
2. fire and end to end: ``tasks`` tasks due at one instant, submitted ahead of it, run by
   ``workers`` no-op workers in this process; rates from the shards' own ``fired_at`` and
   ``finished_at``, and each server's CPU from the instant to the last completion.

A server's CPU is its postmaster's, its live processes' and its reaped backends' (from
``/proc``), so its share of the work shows beside its share of the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from chronoq.bench.raw import BenchError
from chronoq.bench.throughput.measure import server_cpu
from chronoq.bench.throughput.results import (
    SHARD_NODES,
    Context,
    ShardRun,
    ShardServerRun,
)
from chronoq.bench.throughput.submit import spread_tasks, submit_all
from chronoq.bench.throughput.workers import running_workers
from chronoq.client import NewTask
from chronoq.devstack import DevStack, DevStackSettings
from chronoq.diagnostics.task_rows import PAYLOAD, QUEUE
from chronoq.embedded.shards import shard_name
from chronoq.models import TaskState

#: Seconds between two polls of the shards' completed counts.
POLL_S = 0.2


@dataclass
class Shard:
    name: str
    dsn: str
    pid: int


async def phase_shards(ctx: Context) -> None:
    for count in ctx.opts.store_shards:
        run = await shard_run(ctx, count)
        ctx.report.shards.append(run)
        shares = ", ".join(
            f"{s.name} {run.share(s):.0%} / {run.cpu_us_per_task(s):.1f} µs"
            for s in run.servers
        )
        ctx.console.print(
            f"{count} store shard(s): submit {run.submit_per_s:,.0f}/s, fire "
            f"{run.fire_per_s:,.0f}/s, end to end {run.e2e_per_s:,.0f}/s; tasks and "
            f"PostgreSQL CPU per task (submit) by shard: {shares}"
        )


def shards_of(stack: DevStack) -> list[Shard]:
    """Each shard's name, DSN and postmaster PID, shard-0 first."""
    pids = [stack.postgres.pid, *(s.primary_pid for s in stack.shards.servers)]
    dsns = stack.shard_dsns
    out = []
    for index, pid in enumerate(pids):
        name = shard_name(index)
        if pid is None or name not in dsns:
            raise BenchError(f"store shard {name} is not running")
        out.append(Shard(name, dsns[name], pid))
    return out


@contextlib.asynccontextmanager
async def connected(shards: list[Shard]) -> AsyncIterator[dict[str, asyncpg.Connection]]:
    conns: dict[str, asyncpg.Connection] = {}
    try:
        for shard in shards:
            conns[shard.name] = await asyncpg.connect(shard.dsn)
        yield conns
    finally:
        for conn in conns.values():
            await conn.close()


async def shard_run(ctx: Context, count: int) -> ShardRun:
    opts = ctx.opts
    settings = DevStackSettings(
        data_dir=opts.logs.parent / f"store-shards-{count}", port=0, nodes=SHARD_NODES,
        store_shards=count, drop_database=True, restart=False,
    )
    ctx.console.print(f"Starting a stack of {count} store shard(s) and {SHARD_NODES} nodes...")
    async with DevStack(settings) as stack:
        shards = shards_of(stack)
        async with connected(shards) as conns:
            cpu = {s.name: server_cpu(s.pid) for s in shards}
            seconds = await submit_all(
                stack.address, spread_tasks(opts.tasks, timedelta(hours=1)), 1
            )
            submit_cpu = {s.name: server_cpu(s.pid) - cpu[s.name] for s in shards}
            held = await counts(conns, "SELECT count(*) FROM tasks")
            fire_per_s, e2e_per_s, e2e_cpu = await end_to_end(
                ctx, stack.address, shards, conns, submit_seconds=seconds
            )
    return ShardRun(
        shards=count, nodes=SHARD_NODES, tasks=opts.tasks,
        submit_per_s=opts.tasks / seconds, fire_per_s=fire_per_s, e2e_per_s=e2e_per_s,
        servers=[
            ShardServerRun(s.name, held[s.name], submit_cpu[s.name], e2e_cpu[s.name])
            for s in shards
        ],
    )


async def counts(conns: Mapping[str, asyncpg.Connection], sql: str) -> dict[str, int]:
    return {name: int(await conn.fetchval(sql)) for name, conn in conns.items()}


async def end_to_end(
    ctx: Context,
    address: str,
    shards: list[Shard],
    conns: Mapping[str, asyncpg.Connection],
    *,
    submit_seconds: float,
) -> tuple[float, float, dict[str, float]]:
    """Fire and end-to-end tasks/s of ``tasks`` due at one instant, and each server's CPU
    seconds from that instant to the last completion."""
    opts = ctx.opts
    # Due once they are all in: the submit phase's time again, and a margin.
    due = datetime.now(UTC) + timedelta(seconds=2 + 2 * submit_seconds)
    tasks = [NewTask(queue=QUEUE, run_at=due, payload=PAYLOAD) for _ in range(opts.tasks)]
    done_sql = (
        f"SELECT count(*) FROM tasks_with_history WHERE state = {int(TaskState.SUCCEEDED)}"
        f" AND run_at = '{due.isoformat()}'"
    )
    async with running_workers(opts, "in-process", address):
        await submit_all(address, tasks, 1)
        wait = (due - datetime.now(UTC)).total_seconds()
        if wait < 0:
            raise BenchError("shards: the end-to-end tasks came due before all were submitted")
        await asyncio.sleep(wait)
        cpu = {s.name: server_cpu(s.pid) for s in shards}
        deadline = time.monotonic() + 60 + opts.tasks / 200
        while sum((await counts(conns, done_sql)).values()) < opts.tasks:
            if time.monotonic() > deadline:
                raise BenchError(f"shards: {opts.tasks:,} tasks not completed in time")
            await asyncio.sleep(POLL_S)
        e2e_cpu = {s.name: server_cpu(s.pid) - cpu[s.name] for s in shards}
    first = last_fired = last_done = None
    for conn in conns.values():
        row = await conn.fetchrow(
            "SELECT min(fired_at) AS first, max(fired_at) AS fired, max(finished_at) AS done"
            " FROM tasks_with_history WHERE run_at = $1",
            due,
        )
        if row is None or row["first"] is None:
            continue
        first = row["first"] if first is None else min(first, row["first"])
        last_fired = row["fired"] if last_fired is None else max(last_fired, row["fired"])
        last_done = row["done"] if last_done is None else max(last_done, row["done"])
    if first is None or last_fired is None or last_done is None:
        raise BenchError("shards: no fired task found in any shard")
    fire_s = (last_fired - first).total_seconds()
    e2e_s = (last_done - first).total_seconds()
    return (
        opts.tasks / fire_s if fire_s > 0 else 0.0,
        opts.tasks / e2e_s if e2e_s > 0 else 0.0,
        e2e_cpu,
    )
