"""Phase backlog: e2e and lateness on an empty table, then on top of tasks due tomorrow.

The design's promise is that pending work far ahead costs nothing now: every figure of the
backlog runs is printed beside the empty table's, measured the same way just before. Each
table is loaded once and measured ``backlog_runs`` times (the previous measurement's tasks
deleted and vacuumed away each time, the backlog kept), and the medians are compared: a
lateness of a few milliseconds moves more between two runs of one table than a 10% bound.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

from chronoq.bench.throughput.e2e import end_to_end
from chronoq.bench.throughput.lateness import lateness, lateness_layout
from chronoq.bench.throughput.measure import load_pending
from chronoq.bench.throughput.results import (
    BACKLOG_FROM,
    BacklogRun,
    Context,
    EndToEndRun,
    LatenessRun,
)

_Run = TypeVar("_Run", EndToEndRun, LatenessRun)


async def phase_backlog(ctx: Context) -> None:
    """End to end and lateness on an empty table, then on top of each backlog size."""
    layout = lateness_layout(ctx)
    base = await _measure(ctx, layout, 0)
    ctx.report.backlog.append(base)
    for size in ctx.opts.backlog_sizes:
        run = await _measure(ctx, layout, size)
        ctx.report.backlog.append(run)
        e2e, late = run.end_to_end, run.lateness
        many = f" (medians of {len(run.end_to_end_runs)})" if len(run.end_to_end_runs) > 1 else ""
        ctx.console.print(
            f"backlog of {size:,} due tomorrow{many}: end to end {e2e.tasks_per_s:,.0f} tasks/s "
            f"(empty {base.end_to_end.tasks_per_s:,.0f}), CPU per task node+workers+PostgreSQL "
            f"{_cpu(e2e):.0f} µs (empty {_cpu(base.end_to_end):.0f}); lateness p50/p99 "
            f"{late.store_p50_ms:.1f}/{late.store_p99_ms:.1f} ms (empty "
            f"{base.lateness.store_p50_ms:.1f}/{base.lateness.store_p99_ms:.1f}; each run "
            f"{_spread(run.lateness_runs)} vs {_spread(base.lateness_runs)}); run_at to handler "
            f"p99 {late.handler_p99_ms:.1f} ms (empty {base.lateness.handler_p99_ms:.1f})"
        )


async def _measure(ctx: Context, layout: str, size: int) -> BacklogRun:
    """Load ``size`` tasks due tomorrow into a fresh table once, then measure on it."""
    async with ctx.db.fresh(f"backlog_{size}") as dsn:
        started = time.perf_counter()
        if size:
            await load_pending(ctx.console, dsn, size, BACKLOG_FROM, vacuum=True)
        loaded = time.perf_counter() - started
        e2e_runs: list[EndToEndRun] = []
        late_runs: list[LatenessRun] = []
        for _ in range(ctx.opts.backlog_runs):
            e2e_runs.append(await end_to_end(ctx, layout, on=dsn))
            late_runs.append(await lateness(ctx, layout, on=dsn))
    return BacklogRun(
        size,
        loaded,
        _median(e2e_runs, lambda r: r.tasks_per_s),
        _median(late_runs, lambda r: r.store_p99_ms),
        e2e_runs,
        late_runs,
    )


def _median(runs: list[_Run], key: Callable[[_Run], float]) -> _Run:
    """The run at the median of ``key`` (the lower middle one of an even count)."""
    ordered = sorted(runs, key=key)
    return ordered[(len(ordered) - 1) // 2]


def _spread(runs: list[LatenessRun]) -> str:
    p99s = [r.store_p99_ms for r in runs]
    if len(p99s) == 1:
        return f"{p99s[0]:.1f} ms"
    return f"{min(p99s):.1f}-{max(p99s):.1f} ms, sd {statistics.pstdev(p99s):.1f}"


def _cpu(run: EndToEndRun) -> float:
    """CPU per task of a run, all processes: steadier than wall time on a shared machine."""
    return run.node_cpu_us_per_task + run.workers_cpu_us_per_task + run.postgres_cpu_us_per_task
