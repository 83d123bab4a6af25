"""Phase keys: the end-to-end run with every task under one of ``KEYS`` concurrency keys and
its queue limited to one running task per key, beside the same run without keys."""

from __future__ import annotations

from chronoq.bench.throughput.e2e import end_to_end
from chronoq.bench.throughput.results import Context, KeyedRun

#: Concurrency keys the tasks are spread over (each runs one task at a time).
KEYS = 1000


async def phase_keys(ctx: Context) -> None:
    layout = ctx.opts.layouts[0]
    plain = await end_to_end(ctx, layout)
    keyed = await end_to_end(ctx, layout, keys=KEYS)
    run = KeyedRun(keys=KEYS, limit=1, plain=plain, keyed=keyed)
    ctx.report.keyed.append(run)
    ctx.console.print(
        f"end to end, workers {layout}, {KEYS:,} concurrency keys of limit 1: "
        f"{keyed.tasks_per_s:,.0f} tasks/s ({keyed.completed:,} in {keyed.seconds:.2f} s), "
        f"without keys {plain.tasks_per_s:,.0f} tasks/s: the keys cost {run.cost:.0%}; CPU "
        f"per task node+workers+PostgreSQL {_cpu(keyed):.0f} µs (without {_cpu(plain):.0f})"
    )


def _cpu(run: object) -> float:
    from chronoq.bench.throughput.results import EndToEndRun

    assert isinstance(run, EndToEndRun)
    return run.node_cpu_us_per_task + run.workers_cpu_us_per_task + run.postgres_cpu_us_per_task
