"""Phase lateness: tasks due at ``due_rate`` per second; how late they fire and start."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import asyncpg

from chronoq import stats
from chronoq.bench.throughput.measure import (
    COMPLETED_SQL,
    fetchrow,
    measured_on,
    wait_for_count,
)
from chronoq.bench.throughput.results import Context, LatenessRun
from chronoq.bench.throughput.submit import submit_all
from chronoq.bench.throughput.workers import running_workers
from chronoq.client import NewTask
from chronoq.config import NodeSettings
from chronoq.diagnostics.task_rows import PAYLOAD, QUEUE
from chronoq.node import Node


def lateness_layout(ctx: Context) -> str:
    """The worker layout that did best end to end (the last one tried if none ran)."""
    best = ctx.report.best_end_to_end()
    return best.layout if best is not None else ctx.opts.layouts[-1]


async def phase_lateness(ctx: Context) -> None:
    run = await lateness(ctx, lateness_layout(ctx))
    ctx.report.lateness = run
    ctx.console.print(
        f"lateness at {run.due_rate:,}/s: p50 {run.store_p50_ms:.1f} ms, p99 "
        f"{run.store_p99_ms:.1f} ms, max {run.store_max_ms:.1f} ms (store); run_at to handler "
        f"start p50 {run.handler_p50_ms:.1f} ms, p99 {run.handler_p99_ms:.1f} ms"
        + (" [yellow]warning: submission overran the first run_at[/]"
           if run.submit_overran else "")
    )


async def lateness(ctx: Context, layout: str, *, on: str | None = None) -> LatenessRun:
    """One lateness run, on a fresh database or on ``on``, a table the backlog phase loaded
    once and measures several times."""
    opts = ctx.opts
    count = max(1, round(opts.due_rate * opts.lateness_seconds))
    async with measured_on(ctx.db, "lateness", on) as dsn:
        node = Node(NodeSettings(dsn=dsn, port=0))
        await node.start()
        try:
            async with running_workers(opts, layout, node.address) as results:
                # Submitted ahead of time: leave room for the submit itself (>= 4,000/s).
                first = datetime.now(UTC) + timedelta(seconds=3 + count / 4000)
                news = [
                    NewTask(queue=QUEUE, run_at=first + timedelta(seconds=i / opts.due_rate),
                            payload=PAYLOAD)
                    for i in range(count)
                ]
                submit_seconds = await submit_all(node.address, news, 2)
                overran = datetime.now(UTC) > first
                await wait_for_count(
                    ctx.console, dsn, COMPLETED_SQL, count,
                    "completed (lateness)", within=opts.lateness_seconds + 60 + count / 4000 + 3,
                )
            firer = node.firer
            assert firer is not None
            window = firer.lateness
            node_ms = [window.percentile(50) * 1e3, window.percentile(99) * 1e3, window.max * 1e3]
            samples = await fetch_lateness(dsn)
            completed = await fetchrow(
                dsn, "SELECT count(*) AS n FROM tasks_with_history WHERE state = 3"
            )
        finally:
            await node.stop(grace=1.0)
    return LatenessRun(
        due_rate=opts.due_rate, seconds=opts.lateness_seconds, tasks=count, fired=len(samples),
        completed=completed["n"], worker_layout=layout, submit_seconds=submit_seconds,
        submit_overran=overran, store_p50_ms=percentile(samples, 50) * 1e3,
        store_p99_ms=percentile(samples, 99) * 1e3, store_max_ms=max(samples, default=0) * 1e3,
        node_p50_ms=node_ms[0], node_p99_ms=node_ms[1], node_max_ms=node_ms[2],
        handler_p50_ms=percentile(results.start_lateness, 50) * 1e3,
        handler_p99_ms=percentile(results.start_lateness, 99) * 1e3,
        handler_max_ms=max(results.start_lateness, default=0) * 1e3,
    )


async def fetch_lateness(dsn: str) -> list[float]:
    """fired_at - run_at in seconds of every fired task, from the store."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT extract(epoch FROM fired_at - run_at)::float8 AS late FROM tasks_with_history"
            " WHERE fired_at IS NOT NULL"
        )
    finally:
        await conn.close()
    return [float(r["late"]) for r in rows]


def percentile(samples: Sequence[float], p: float) -> float:
    """``chronoq.stats.percentile``, as ``LatenessWindow.percentile`` reports it; 0 when empty."""
    return stats.percentile(samples, p) or 0.0
