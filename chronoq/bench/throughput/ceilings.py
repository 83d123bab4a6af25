"""Phase raw: the raw-SQL ceilings of the same run and server (``chronoq.bench.raw``)."""

from __future__ import annotations

from chronoq.bench.raw import (
    measure_ceilings,
)
from chronoq.bench.throughput.results import Context


async def phase_raw(ctx: Context) -> None:
    async with ctx.db.fresh("raw") as dsn:
        raw = await measure_ceilings(
            dsn, rows=ctx.opts.tasks, claim_batch=ctx.opts.concurrency,
            connections=sorted({1, 2, 4, *ctx.opts.submitters}),
        )
    ctx.report.raw = raw
    inserts = ", ".join(f"{n} conn {v:,.0f}" for n, v in raw.insert_per_s.items())
    claims = ", ".join(f"{n} conn {v:,.0f}" for n, v in raw.claim_complete_per_s.items())
    ctx.console.print(
        f"raw rows/s: insert {inserts}; fire {raw.fire_per_s:,.0f} "
        f"({raw.fire_statements} statements); claim+complete {claims}"
    )
