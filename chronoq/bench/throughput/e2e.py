"""Phase e2e: tasks due at once, run by no-op workers; first fire to last completion, with
the CPU each process spent per task.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from chronoq.bench.raw import (
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
from chronoq.config import NodeSettings
from chronoq.node import Node


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


async def end_to_end(ctx: Context, layout: str, *, on: str | None = None) -> EndToEndRun:
    """One end-to-end run, on a fresh database or on ``on``, a table the backlog phase
    loaded once and measures several times."""
    opts = ctx.opts
    async with measured_on(ctx.db, "e2e_" + layout.replace("-", "_"), on) as dsn:
        node = Node(NodeSettings(dsn=dsn, port=0))
        await node.start()
        try:
            async with running_workers(opts, layout, node.address) as results:
                due = datetime.now(UTC) + timedelta(seconds=2)
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
                " max(finished_at) AS last FROM tasks",
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
