"""Phase fire: a node on a ``ManualClock`` jumps past its tasks' run_at and fires them all."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta

from chronoq.bench.raw import (
    BenchError,
    copy_tasks,
)
from chronoq.bench.throughput.results import Context, FireRun
from chronoq.clock import ManualClock
from chronoq.config import NodeSettings
from chronoq.node import Node


async def phase_fire(ctx: Context) -> None:
    opts = ctx.opts
    async with ctx.db.fresh("fire") as dsn:
        clock = ManualClock()
        await copy_tasks(dsn, opts.tasks, clock.now() + timedelta(minutes=2), timedelta(minutes=1))
        node = Node(NodeSettings(dsn=dsn, port=0), clock=clock)
        await node.start()
        try:
            firer = node.firer
            assert firer is not None
            await asyncio.sleep(0.5)  # the first ticks take the fences; nothing is due yet
            before = dataclasses.replace(firer.stats)
            clock.advance(timedelta(minutes=4))
            started = time.perf_counter()
            firer.poke()
            deadline = started + 60 + opts.tasks / 500
            while firer.stats.fired - before.fired < opts.tasks:
                if time.perf_counter() > deadline:
                    raise BenchError(
                        f"fire: only {firer.stats.fired - before.fired} of {opts.tasks} fired"
                    )
                await asyncio.sleep(0.002)
            seconds = time.perf_counter() - started
            run = FireRun(
                opts.tasks, seconds, opts.tasks / seconds,
                firer.stats.statements - before.statements, firer.stats.ticks - before.ticks,
            )
        finally:
            await node.stop(grace=1.0)
    ctx.report.fire = run
    ctx.console.print(
        f"fire: {run.tasks_per_s:,.0f} tasks/s ({run.statements} statements in {run.ticks} ticks)"
    )
