"""Phase backlog: e2e and lateness on an empty table, then on top of tasks due tomorrow.

The design's promise is that pending work far ahead costs nothing now: every figure of the
backlog runs is printed beside the empty run measured just before it.
"""

from __future__ import annotations

import time

from chronoq.bench.throughput.e2e import end_to_end
from chronoq.bench.throughput.lateness import lateness, lateness_layout
from chronoq.bench.throughput.results import BacklogRun, Context, EndToEndRun


async def phase_backlog(ctx: Context) -> None:
    """End to end and lateness on an empty table, then on top of each backlog size."""
    layout = lateness_layout(ctx)
    base_e2e = await end_to_end(ctx, layout)
    base_late = await lateness(ctx, layout)
    ctx.report.backlog.append(BacklogRun(0, 0.0, base_e2e, base_late))
    for size in ctx.opts.backlog_sizes:
        started = time.perf_counter()
        e2e = await end_to_end(ctx, layout, size)
        late = await lateness(ctx, layout, size)
        run = BacklogRun(size, time.perf_counter() - started, e2e, late)
        ctx.report.backlog.append(run)
        ctx.console.print(
            f"backlog of {size:,} due tomorrow: end to end {e2e.tasks_per_s:,.0f} tasks/s "
            f"(empty {base_e2e.tasks_per_s:,.0f}), CPU per task node+workers+PostgreSQL "
            f"{_cpu(e2e):.0f} µs (empty {_cpu(base_e2e):.0f}); lateness p50/p99 "
            f"{late.store_p50_ms:.0f}/"
            f"{late.store_p99_ms:.0f} ms (empty {base_late.store_p50_ms:.0f}/"
            f"{base_late.store_p99_ms:.0f}); run_at to handler p99 {late.handler_p99_ms:.0f} ms "
            f"(empty {base_late.handler_p99_ms:.0f})"
        )


def _cpu(run: EndToEndRun) -> float:
    """CPU per task of a run, all processes: steadier than wall time on a shared machine."""
    return run.node_cpu_us_per_task + run.workers_cpu_us_per_task + run.postgres_cpu_us_per_task
