"""Phase e2e: tasks due at once, run by no-op workers; first fire to last completion, with
the CPU each process spent per task.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg

from chronoq.bench.raw import (
    BenchError,
    copy_tasks,
)
from chronoq.bench.throughput.measure import (
    COMPLETED_SQL,
    cpu_now,
    fetchrow,
    measured_on,
    transactions,
    wait_for_count,
)
from chronoq.bench.throughput.results import Context, EndToEndRun
from chronoq.bench.throughput.workers import running_workers
from chronoq.buckets import DEFAULT_BUCKET_SECONDS, bucket_of
from chronoq.config import NodeSettings
from chronoq.diagnostics.task_rows import QUEUE
from chronoq.node import Node


async def keyed_queue(dsn: str, keys: int, due: datetime) -> None:
    """Their queue limited to one running task per key (as ``chronoq queue set
    --max-running-per-key 1`` does), then the tasks (due in an hour: nothing fires them
    meanwhile) spread over ``keys`` concurrency keys and due at ``due``, in one write."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO queue_settings (namespace, queue, max_running_per_key, updated_at)"
            " VALUES ('default', $1, 1, now())",
            QUEUE,
        )
        await conn.execute(
            "UPDATE tasks SET concurrency_key = 'key-' || (abs(hashtext(id::text)) % $1),"
            " run_at = $2, bucket = $3",
            keys,
            due,
            bucket_of(due, DEFAULT_BUCKET_SECONDS),
        )
        await conn.execute("ANALYZE tasks")
    finally:
        await conn.close()
    if datetime.now(UTC) >= due:
        raise BenchError("the tasks came due before their keys were set: use fewer tasks")


async def phase_e2e(ctx: Context) -> None:
    for layout in ctx.opts.layouts:
        run = await end_to_end(ctx, layout)
        ctx.report.end_to_end.append(run)
        ctx.console.print(
            f"end to end, workers {layout}, {ctx.opts.protocol}: {run.tasks_per_s:,.0f} tasks/s "
            f"({run.completed:,} in {run.seconds:.2f} s; "
            f"{run.pg_transactions_per_task:.3f} PostgreSQL transactions per task; CPU per "
            f"task: node {run.node_cpu_us_per_task:.0f} µs, workers "
            f"{run.workers_cpu_us_per_task:.0f} µs, PostgreSQL "
            f"{run.postgres_cpu_us_per_task:.0f} µs; {run.claimed_on_ack:,} claims rode on acks)"
        )


async def end_to_end(
    ctx: Context, layout: str, *, on: str | None = None, keys: int = 0
) -> EndToEndRun:
    """One end-to-end run, on a fresh database or on ``on``, a table the backlog phase
    loaded once and measures several times. ``keys``: every task gets one of that many
    concurrency keys, and the queue runs one task of a key at a time (``phase_keys``)."""
    opts = ctx.opts
    name = "e2e_" + layout.replace("-", "_") + (f"_keys_{keys}" if keys else "")
    async with measured_on(ctx.db, name, on) as dsn:
        node = Node(NodeSettings(dsn=dsn, port=0))
        await node.start()
        try:
            async with running_workers(opts, layout, node.address) as results:
                due = datetime.now(UTC) + timedelta(seconds=2)
                if keys:  # loaded due later, keyed and made due in one write nothing races
                    await copy_tasks(dsn, opts.tasks, due + timedelta(hours=1), timedelta(0))
                    await keyed_queue(dsn, keys, datetime.now(UTC) + timedelta(seconds=3))
                else:
                    await copy_tasks(dsn, opts.tasks, due, timedelta(0))
                xacts_before = await transactions(dsn)
                cpu_before = cpu_now(results.pids, ctx.postgres)
                await wait_for_count(
                    ctx.console, dsn, COMPLETED_SQL, opts.tasks,
                    f"completed ({layout})", within=60 + opts.tasks / 200,
                )
                cpu = [b - a for a, b in zip(
                    cpu_before, cpu_now(results.pids, ctx.postgres), strict=True
                )]
                # Backends publish their statistics at most about once a second.
                await asyncio.sleep(1.2)
                xacts = await transactions(dsn) - xacts_before
            row = await fetchrow(
                dsn,
                "SELECT count(*) FILTER (WHERE state = 3) AS completed, min(fired_at) AS first,"
                " max(finished_at) AS last FROM tasks_with_history",
            )
        finally:
            await node.stop(grace=1.0)
    seconds = (row["last"] - row["first"]).total_seconds()
    return EndToEndRun(
        layout=layout, workers=opts.workers, concurrency=opts.concurrency, tasks=opts.tasks,
        completed=row["completed"], seconds=seconds,
        tasks_per_s=row["completed"] / seconds if seconds > 0 else 0.0,
        claimed=results.counts.get("claimed", 0),
        pg_transactions_per_task=xacts / opts.tasks,
        node_cpu_us_per_task=cpu[0] * 1e6 / opts.tasks,
        workers_cpu_us_per_task=cpu[1] * 1e6 / opts.tasks,
        postgres_cpu_us_per_task=cpu[2] * 1e6 / opts.tasks,
        claimed_on_ack=results.counts.get("claimed_on_ack", 0),
        protocol=opts.protocol,
        prefetch=opts.prefetch,
    )
