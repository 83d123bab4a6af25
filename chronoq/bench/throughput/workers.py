"""The benchmark's workers: in this process, or one process each (``children``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from chronoq.bench.throughput.children import Child
from chronoq.bench.throughput.handler import noop, take_handler_starts
from chronoq.bench.throughput.results import Options, worker_protocol
from chronoq.client import Client, Worker
from chronoq.diagnostics.task_rows import QUEUE


@dataclass
class WorkerResults:
    """Summed worker statistics and each handler's start lateness (s), filled in at stop."""

    counts: dict[str, int] = field(default_factory=dict)
    start_lateness: list[float] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # worker processes (none when in-process)

    def add(self, stats: dict[str, Any]) -> None:
        for key, value in stats.items():
            if isinstance(value, int):
                self.counts[key] = self.counts.get(key, 0) + value
            elif key == "start_lateness" and isinstance(value, list):
                self.start_lateness.extend(float(v) for v in value)


@contextlib.asynccontextmanager
async def running_workers(
    opts: Options, layout: str, address: str
) -> AsyncIterator[WorkerResults]:
    """Run ``opts.workers`` workers (``in-process``, or ``processes``: one each); results at
    stop."""
    count, concurrency, logs = opts.workers, opts.concurrency, opts.logs
    results = WorkerResults()
    take_handler_starts()
    if layout == "in-process":
        clients = [Client(address, timeout=60) for _ in range(count)]
        workers = [
            Worker(
                c, {QUEUE: noop}, concurrency=concurrency, worker_id=f"bench-{i}",
                stream=worker_protocol(opts.protocol)[0],
                claim_on_ack=worker_protocol(opts.protocol)[1],
                prefetch=opts.prefetch,
            )
            for i, c in enumerate(clients)
        ]
        runs = [asyncio.create_task(w.run()) for w in workers]
        try:
            yield results
        finally:
            for w in workers:
                w.stop()
            for s in await asyncio.gather(*runs):
                results.add(dataclasses.asdict(s))
            results.start_lateness.extend(take_handler_starts())
            for c in clients:
                await c.close()
        return
    spawned = await asyncio.gather(
        *(
            Child.spawn(
                f"worker-{i}",
                ["worker", "--address", address, "--concurrency", str(concurrency),
                 "--id", f"bench-{i}",
                 "--protocol", opts.protocol,
                 *(["--prefetch", str(opts.prefetch)] if opts.prefetch is not None else [])],
                logs,
            )
            for i in range(count)
        ),
        return_exceptions=True,
    )
    children = [c for c in spawned if isinstance(c, Child)]
    results.pids = [c.pid for c in children]
    try:
        for failure in spawned:
            if isinstance(failure, BaseException):
                raise failure
        yield results
    finally:
        for stats in await asyncio.gather(*(c.stop() for c in children)):
            results.add(stats)
