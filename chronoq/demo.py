"""The one-command tour behind ``chronoq demo``: a local cluster, timed tasks, workers, retries.

It runs on a fresh database of the embedded stack, dropped at the end. What it prints is the
caller's: progress and the outcome come back through ``announce``, ``on_counts`` and the
returned ``DemoRun``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chronoq.client import Client, MemberStatus, NewTask, Worker
from chronoq.client.demo import DEMO_QUEUE, DemoPayload, DemoSummary, demo_payloads, handlers_for
from chronoq.client.demo import summarize as summarize_tasks
from chronoq.devstack import DevStack, DevStackSettings
from chronoq.durations import format_duration
from chronoq.models import TaskState
from chronoq.redact import mask_dsn

DEFAULT_DATA_DIR = Path(".chronoq")
"""Where the local stack keeps its data unless told otherwise (``chronoq dev`` and ``demo``)."""
SUBMIT_BATCH = 1000
"""Tasks per SubmitBatch call."""
DEMO_MAX_ATTEMPTS = 3
DEMO_BACKOFF_INITIAL = timedelta(milliseconds=200)
DEMO_BACKOFF_MAX = timedelta(seconds=2)
FINISH_GRACE = timedelta(seconds=60)
"""How long after the last run_at the tasks may take to finish."""
WATCH_INTERVAL = 0.25
"""Seconds between two counts of the tasks by state."""


@dataclass(frozen=True)
class DemoOptions:
    """What to run: ``tasks`` spread over ``over`` on ``nodes`` nodes, served by ``workers``."""

    tasks: int = 3000
    over: timedelta = timedelta(seconds=60)
    workers: int = 4
    concurrency: int = 50
    fail_rate: float = 0.05
    data_dir: Path = DEFAULT_DATA_DIR
    seed: int = 0
    nodes: int = 3
    pg_members: int = 1  # >1: a replicated PostgreSQL under Patroni
    store_shards: int = 1  # >1: that many store shards, each its own server

    @property
    def deadline(self) -> float:
        """Seconds the run may take before it counts as unfinished."""
        return (self.over + FINISH_GRACE).total_seconds()


@dataclass(frozen=True)
class DemoRun:
    """What became of a demo run."""

    summary: DemoSummary
    payloads: list[DemoPayload]
    members: list[MemberStatus]
    wall_seconds: float
    finished: bool  # every task terminal before the deadline and no stop

    @property
    def expected_dead(self) -> tuple[int, int]:
        """Tasks meant to die: (fatal, out of attempts)."""
        fatal = sum(p.fatal for p in self.payloads)
        exhausted = sum(not p.fatal and p.fail_attempts >= DEMO_MAX_ATTEMPTS for p in self.payloads)
        return fatal, exhausted


async def run_demo(
    opts: DemoOptions,
    stop: asyncio.Event,
    *,
    announce: Callable[[str], None],
    on_counts: Callable[[dict[TaskState, int]], None],
) -> DemoRun:
    """Run the demo until every task is terminal, the deadline passes or ``stop`` is set."""
    database = f"demo_{datetime.now(UTC):%Y%m%d_%H%M%S}_{os.getpid()}"
    settings = DevStackSettings(
        data_dir=opts.data_dir,
        port=0,
        database=database,
        drop_database=True,
        nodes=opts.nodes,
        pg_members=opts.pg_members,
        store_shards=opts.store_shards,
    )
    what = "a node" if not settings.clustered else f"etcd and {opts.nodes} nodes"
    if settings.sharded:
        what += f" on {opts.store_shards} store shards"
    announce(f"starting {what} on the embedded stack in {opts.data_dir} (database {database}) …")
    async with DevStack(settings) as stack:
        if settings.sharded:
            announce("store shards: " + ", ".join(
                f"{name} {mask_dsn(dsn)}" for name, dsn in stack.shard_dsns.items()
            ))  # fmt: skip
        announce(
            f"nodes on {', '.join(stack.addresses)}; submitting {opts.tasks} tasks over "
            f"{format_duration(opts.over)} to {opts.workers} workers"
        )
        started = time.monotonic()
        payloads = demo_payloads(opts.tasks, fail_rate=opts.fail_rate, seed=opts.seed)
        async with Client(stack.address, timeout=60) as client:
            await _submit(client, payloads, opts.over)
            async with _workers(stack.addresses, opts):
                finished = await _watch(stack, opts, stop, on_counts)
            summary = summarize_tasks([t async for t in client.iter_tasks(queue=DEMO_QUEUE)])
            members = await _members_counted(client, summary.fired)
        wall = time.monotonic() - started
    return DemoRun(summary, payloads, members, wall, finished)


#: How long the summary waits for the nodes' published counters to catch up with the store
#: (nodes publish their stats every second).
STATS_CATCH_UP_SECONDS = 3.0


async def _members_counted(client: Client, fired: int) -> list[MemberStatus]:
    """The members' status once their published fire counters account for the ``fired``
    tasks the store shows (each retry is a fire too, so they may count more), or the last
    status read after ``STATS_CATCH_UP_SECONDS``."""
    deadline = time.monotonic() + STATS_CATCH_UP_SECONDS
    while True:
        members = (await client.status(bucket_horizon=0)).members
        if sum(m.fired_total for m in members) >= fired or time.monotonic() >= deadline:
            return members
        await asyncio.sleep(0.25)


async def _submit(client: Client, payloads: list[DemoPayload], over: timedelta) -> None:
    now = datetime.now(UTC)
    specs = [
        NewTask(
            queue=DEMO_QUEUE,
            run_at=now + over * (i + 1) / len(payloads),
            payload=p.encode(),
            idempotency_key=f"demo-{p.n}",
            max_attempts=DEMO_MAX_ATTEMPTS,
            backoff_initial=DEMO_BACKOFF_INITIAL,
            backoff_max=DEMO_BACKOFF_MAX,
        )
        for i, p in enumerate(payloads)
    ]
    for start in range(0, len(specs), SUBMIT_BATCH):
        await client.submit_ids(specs[start : start + SUBMIT_BATCH])


@contextlib.asynccontextmanager
async def _workers(addresses: list[str], opts: DemoOptions) -> AsyncIterator[list[Worker]]:
    """Workers spread over the nodes: any node serves any task."""
    async with contextlib.AsyncExitStack() as resources:
        workers = []
        for i in range(opts.workers):
            address = addresses[i % len(addresses)]
            client = await resources.enter_async_context(Client(address, timeout=30))
            workers.append(
                Worker(
                    client,
                    handlers_for([DEMO_QUEUE]),
                    concurrency=opts.concurrency,
                    worker_id=f"demo-worker-{i + 1}",
                )
            )
        runs = [
            asyncio.create_task(w.run(), name=f"demo-worker-{i + 1}") for i, w in enumerate(workers)
        ]
        try:
            yield workers
        finally:
            for w in workers:
                w.stop()
            await asyncio.gather(*runs, return_exceptions=True)


def run_counts(in_tasks: Mapping[TaskState, int], submitted: int) -> dict[TaskState, int]:
    """The run's tasks by state from the counts of ``tasks``, whose finished rows move into
    the task history ``history_after`` after they finish: the run's database holds its own
    ``submitted`` tasks only, and those end SUCCEEDED or DEAD (which stays in ``tasks``), so
    the ones ``tasks`` no longer holds are SUCCEEDED. No read of the history."""
    counts = dict(in_tasks)
    moved = submitted - sum(counts.values())
    if moved > 0:
        counts[TaskState.SUCCEEDED] = counts.get(TaskState.SUCCEEDED, 0) + moved
    return counts


async def _watch(
    stack: DevStack,
    opts: DemoOptions,
    stop: asyncio.Event,
    on_counts: Callable[[dict[TaskState, int]], None],
) -> bool:
    """Report counts until every task is terminal (True), or the deadline or a stop (False)."""
    deadline = time.monotonic() + opts.deadline
    while True:
        counts = run_counts(await stack.count_by_state(), opts.tasks)
        on_counts(counts)
        if sum(n for s, n in counts.items() if s.terminal) >= opts.tasks:
            return True
        if stop.is_set() or time.monotonic() >= deadline:
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WATCH_INTERVAL):
                await stop.wait()
