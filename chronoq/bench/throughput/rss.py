"""Phase rss: a node process's memory with each pending size loaded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from chronoq.bench.throughput.children import Child
from chronoq.bench.throughput.measure import load_pending
from chronoq.bench.throughput.results import Context, RssRun


async def phase_rss(ctx: Context) -> None:
    opts = ctx.opts
    for size in opts.pending_sizes:
        async with ctx.db.fresh(f"rss_{size}") as dsn:
            load = await load_pending(ctx.console, dsn, size)
            node = await Child.spawn_node(f"node-rss-{size}", dsn, opts.logs)
            try:
                await asyncio.sleep(opts.rss_settle_seconds)
                rss, hwm = memory_kib(node.pid)
            finally:
                stats = await node.stop()
        run = RssRun(size, load, opts.rss_settle_seconds, rss, hwm, int(stats.get("ticks", 0)))
        ctx.report.rss.append(run)
        ctx.console.print(
            f"node RSS with {size:,} pending: {rss / 1024:.1f} MiB (peak {hwm / 1024:.1f} MiB, "
            f"{run.ticks} firing ticks; loaded in {load:.1f} s)"
        )


def memory_kib(pid: int) -> tuple[int, int]:
    """VmRSS and VmHWM (peak) of ``pid`` in KiB, from /proc/<pid>/status."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]
