"""Phase submit: batched ``submit_ids`` through a node in a child process, 1..n submitters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from chronoq.bench.raw import (
    BenchError,
)
from chronoq.bench.throughput.children import Child
from chronoq.bench.throughput.measure import cpu_now
from chronoq.bench.throughput.results import SUBMIT_BATCH, Context, SubmitRun
from chronoq.client import Client, NewTask
from chronoq.diagnostics.task_rows import PAYLOAD, QUEUE


async def phase_submit(ctx: Context) -> None:
    opts = ctx.opts
    async with ctx.db.fresh("submit") as dsn:
        node = await Child.spawn_node("node-submit", dsn, opts.logs)
        try:
            await submit_all(node.info, spread_tasks(SUBMIT_BATCH, timedelta(hours=1)), 1)
            for n in opts.submitters:
                batch = spread_tasks(opts.tasks, timedelta(hours=1))
                before = cpu_now([node.pid], ctx.postgres)
                seconds = await submit_all(node.info, batch, n)
                cpu = [
                    (b - a) * 1e6 / opts.tasks
                    for a, b in zip(before, cpu_now([node.pid], ctx.postgres), strict=True)
                ]
                run = SubmitRun(n, opts.tasks, seconds, opts.tasks / seconds, *cpu)
                ctx.report.submit.append(run)
                ctx.console.print(
                    f"submit, {n} submitter(s): {run.tasks_per_s:,.0f} tasks/s ({seconds:.2f} s; "
                    f"CPU per task: clients {cpu[0]:.0f} µs, node {cpu[1]:.0f} µs, PostgreSQL "
                    f"{cpu[2]:.0f} µs)"
                )
        finally:
            await node.stop()


def spread_tasks(count: int, spread: timedelta) -> list[NewTask]:
    """``count`` tasks due over ``spread`` starting in 5 minutes: nothing fires while we submit."""
    first = datetime.now(UTC) + timedelta(minutes=5)
    step = spread / count
    return [NewTask(queue=QUEUE, run_at=first + step * i, payload=PAYLOAD) for i in range(count)]


async def submit_all(
    address: str, tasks: Sequence[NewTask], submitters: int, *, batch: int = SUBMIT_BATCH
) -> float:
    """Submit ``tasks`` in batches of ``batch``, ``submitters`` clients at once, each call
    after the client's previous one; seconds until all accepted."""
    batches = [tasks[i:i + batch] for i in range(0, len(tasks), batch)]
    clients = [Client(address, timeout=120) for _ in range(submitters)]
    try:
        for client in clients:
            await client.wait_ready()

        async def submit(client: Client, mine: Sequence[Sequence[NewTask]]) -> int:
            created = 0
            for part in mine:
                created += sum(c for _id, c in await client.submit_ids(part))
            return created

        started = time.perf_counter()
        created = await asyncio.gather(
            *(submit(c, batches[i::submitters]) for i, c in enumerate(clients))
        )
        seconds = time.perf_counter() - started
    finally:
        for client in clients:
            await client.close()
    if sum(created) != len(tasks):
        raise BenchError(f"submit: {sum(created)} of {len(tasks)} tasks were created")
    return seconds
