"""``chronoq bench move``: an online move of partitions between two store shards, timed.

A real local cluster (etcd, two embedded PostgreSQL servers, ``nodes`` node processes) with
``partitions`` split evenly over ``shard-0`` and ``shard-1``. ``pending`` tasks an hour or two
ahead are loaded into ``shard-0``'s partitions (COPY, straight into the table), then a client
submits ``due_rate`` tasks per second due in about a second, over every partition, through
the SDK (keyed: a refusal is repeated with the same key), and a worker in this process runs
them. While that goes on, ``moved`` of ``shard-0``'s partitions move to ``shard-1``
(``MovePartitions``); the table says:

- how long the move took (asked → committed → cleaned up) and the rows it copied;
- the *firing gap* of the moved partitions: the longest a task of theirs that came due during
  the move waited past its ``run_at`` (the frozen step plus the owners' map watch);
- the lateness p50 / p99 / max of the other partitions' tasks due during the move;
- submit errors the client saw (each repeated with its key) and tasks lost (must be 0).

The issue's figure: ``--pending 1000000 --due-rate 1000``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from rich.console import Console
from rich.table import Table

from chronoq.client import Client, NewTask, Worker
from chronoq.client.context import TaskContext
from chronoq.client.values import MoveStatus
from chronoq.diagnostics.task_rows import COPY_COLUMNS, copy_rows, task_rows
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import ChronoqError
from chronoq.local.cluster import ClusterSpec, LocalCluster
from chronoq.routing import id_partition

QUEUE = "bench-move"
#: Seconds of due load before the move is asked for (the baseline).
WARM_UP_S = 3.0
#: Seconds the due load goes on after the move is done.
COOL_DOWN_S = 3.0
#: Seconds a move may take at most here before the run gives up.
MOVE_LIMIT_S = 1800.0


class BenchError(ChronoqError):
    """The benchmark could not run (a bad size, a stack that did not start)."""


@dataclass
class MoveReport:
    pending: int
    due_rate: int
    partitions: int
    moved: int
    nodes: int
    phase_seconds: dict[str, float] = field(default_factory=dict)  # first seen, from the ask
    move_seconds: float = 0.0  # asked -> done
    commit_seconds: float = 0.0  # asked -> committed
    rows_copied: int = 0
    rounds: int = 0
    submitted: int = 0
    submit_errors: int = 0
    lost: int = 0
    early: int = 0
    moved_gap_s: float = 0.0  # the longest wait past run_at of a moved partition's task
    moved_late_p99_s: float = 0.0
    other_late_p50_s: float = 0.0
    other_late_p99_s: float = 0.0
    other_late_max_s: float = 0.0
    outcome: str = ""


@dataclass
class _Load:
    """The due load: what was accepted, what ran, and the errors the client saw."""

    submitted: dict[str, datetime] = field(default_factory=dict)  # id -> run_at
    started: dict[str, datetime] = field(default_factory=dict)  # id -> first start
    errors: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    finish: asyncio.Event = field(default_factory=asyncio.Event)


def main(
    *,
    pending: int = 200_000,
    due_rate: int = 200,
    partitions: int = 128,
    moved: int = 64,
    nodes: int = 2,
    data_dir: Path | None = None,
    json_out: Path | None = None,
) -> MoveReport:
    """Run one move on a fresh two-shard stack and print the table."""
    if moved < 1 or moved > partitions // 2:
        raise BenchError(f"--moved must be 1..{partitions // 2} (shard-0 holds half)")
    if pending < 0 or due_rate < 1:
        raise BenchError("--pending is 0 or more and --due-rate 1 or more")
    console = Console()
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="chronoq-bench-move-"))
    shard1 = EmbeddedPostgres(workdir / "postgres-shard-1", durable=False)
    spec = ClusterSpec(
        nodes=nodes, partitions=partitions, lease_ttl=2, tick_ms=50, durable=False,
        cluster="bench-move",
    )  # fmt: skip
    report = MoveReport(pending, due_rate, partitions, moved, nodes)
    console.print(f"starting etcd, 2 PostgreSQL servers and {nodes} nodes in {workdir} …")
    shard1.start()
    try:
        dsn1, _ = shard1.ensure_database("chronoq")
        cluster = LocalCluster(workdir, spec, store_shards=[dsn1])
        cluster.start()
        try:
            asyncio.run(_run(cluster, report, console))
        finally:
            cluster.stop()
    finally:
        shard1.stop()
    console.print(render(report))
    if json_out is not None:
        json_out.write_text(json.dumps(asdict(report), indent=2))
    return report


async def _run(cluster: LocalCluster, report: MoveReport, console: Console) -> None:
    addresses = ",".join(cluster.addresses)
    moving = list(range(report.moved))  # shard-0 holds 0 .. partitions/2 - 1
    if report.pending:
        console.print(f"loading {report.pending:,} pending tasks into partitions 0-{moving[-1]} …")
        await _fill(cluster.dsn, report.pending, report.partitions, moving)
    load = _Load()
    admin = Client(addresses, timeout=30)
    submitting = asyncio.create_task(_submit(addresses, load, report.due_rate))
    working = asyncio.create_task(_work(addresses, load))
    try:
        await asyncio.sleep(WARM_UP_S)
        span = f"0-{moving[-1]}"
        console.print(f"moving partitions {span} to shard-1 under {report.due_rate} tasks/s …")
        asked_at = time.monotonic()
        window_start = datetime.now(UTC)
        (asked,) = await admin.move_partitions(span, "shard-1")
        final = await _follow(admin, asked.id, asked_at, report)
        report.move_seconds = time.monotonic() - asked_at
        window_end = datetime.now(UTC)
        report.outcome = final.phase + (f": {final.error}" if final.error else "")
        report.rows_copied, report.rounds = final.rows_copied, final.rounds
        await asyncio.sleep(COOL_DOWN_S)
        load.stop.set()
        await asyncio.wait_for(submitting, 60)
        for _ in range(480):  # every accepted task runs (bounded: 2 minutes)
            if set(load.submitted) <= set(load.started):
                break
            await asyncio.sleep(0.25)
    finally:
        load.stop.set()
        load.finish.set()
        for task in (submitting, working):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 40)
        await admin.close()
    _figures(report, load, set(moving), window_start, window_end)


async def _fill(dsn: str, count: int, partitions: int, among: list[int]) -> None:
    now = datetime.now(UTC)
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        rows = task_rows(
            count, now + timedelta(hours=1), timedelta(hours=1), now=now,
            partitions=partitions, among=among,
        )  # fmt: skip
        await copy_rows(conn, rows, count, columns=COPY_COLUMNS)
    finally:
        await conn.close()


async def _submit(addresses: str, load: _Load, rate: int) -> None:
    """``rate`` tasks per second, in batches every 50 ms, due a second after their submit."""
    client = Client(addresses, timeout=10)
    per_batch = max(1, rate // 20)
    try:
        while not load.stop.is_set():
            started = time.monotonic()
            run_at = datetime.now(UTC) + timedelta(seconds=1)
            batch = [
                NewTask(queue=QUEUE, run_at=run_at, idempotency_key=f"due-{uuid.uuid4().hex}")
                for _ in range(per_batch)
            ]
            for _ in range(100):  # a refusal is repeated with the same keys
                try:
                    out = await client.submit_many(batch)
                except ChronoqError:
                    load.errors += 1
                    await asyncio.sleep(0.1)
                    continue
                for o in out:
                    load.submitted[o.task.id] = o.task.run_at
                break
            await asyncio.sleep(max(0.0, 0.05 - (time.monotonic() - started)))
    finally:
        await client.close()


async def _work(addresses: str, load: _Load) -> None:
    client = Client(addresses, timeout=10)

    async def handle(ctx: TaskContext) -> None:
        load.started.setdefault(ctx.id, datetime.now(UTC))

    worker = Worker(client, {QUEUE: handle}, concurrency=100)
    running = asyncio.create_task(worker.run())
    try:
        await load.finish.wait()
    finally:
        worker.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 30)
        await client.close()


async def _follow(admin: Client, move_id: str, asked_at: float, report: MoveReport) -> MoveStatus:
    """Poll the move until it ends; the first time each phase was seen, from the ask."""
    deadline = asked_at + MOVE_LIMIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChronoqError):
            status = await admin.status()
            found = [
                m for m in (status.shard_map.moves if status.shard_map else []) if m.id == move_id
            ]
            if found:
                m = found[0]
                report.phase_seconds.setdefault(m.phase, round(time.monotonic() - asked_at, 2))
                if m.phase in ("committed", "clean_up", "done") and not report.commit_seconds:
                    report.commit_seconds = time.monotonic() - asked_at
                if m.phase in ("done", "rolled_back"):
                    return m
        await asyncio.sleep(0.1)
    raise BenchError(f"the move did not end within {MOVE_LIMIT_S:.0f} s")


def _figures(
    report: MoveReport, load: _Load, moving: set[int], start: datetime, end: datetime
) -> None:
    report.submitted = len(load.submitted)
    report.submit_errors = load.errors
    report.lost = len(set(load.submitted) - set(load.started))
    moved_late: list[float] = []
    other_late: list[float] = []
    for task_id, run_at in load.submitted.items():
        began = load.started.get(task_id)
        if began is None:
            continue
        late = (began - run_at).total_seconds()
        if late < 0:
            report.early += 1
        if not start <= run_at <= end:
            continue
        partition = id_partition(uuid.UUID(task_id), report.partitions)
        (moved_late if partition in moving else other_late).append(max(0.0, late))
    if moved_late:
        report.moved_gap_s = max(moved_late)
        report.moved_late_p99_s = _p99(moved_late)
    if other_late:
        report.other_late_p50_s = statistics.median(other_late)
        report.other_late_p99_s = _p99(other_late)
        report.other_late_max_s = max(other_late)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def render(report: MoveReport) -> Table:
    table = Table(
        title=(
            f"move of {report.moved} partitions ({report.pending:,} pending) from shard-0 to "
            f"shard-1, {report.due_rate} tasks/s due, {report.nodes} nodes, "
            f"{report.partitions} partitions"
        )
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    phases = ", ".join(f"{p} {s:.1f}" for p, s in report.phase_seconds.items())
    rows = [
        ("outcome", report.outcome),
        ("asked → committed", f"{report.commit_seconds:.1f} s"),
        ("asked → cleaned up (done)", f"{report.move_seconds:.1f} s"),
        ("phases first seen at (s)", phases),
        ("rows copied (copy + rounds)", f"{report.rows_copied:,} ({report.rounds} rounds)"),
        ("firing gap of moved partitions (max late)", f"{report.moved_gap_s:.2f} s"),
        ("moved partitions lateness p99", f"{report.moved_late_p99_s:.2f} s"),
        ("other partitions lateness p50 / p99 / max",
         f"{report.other_late_p50_s:.3f} / {report.other_late_p99_s:.3f} / "
         f"{report.other_late_max_s:.3f} s"),
        ("tasks submitted (due load)", f"{report.submitted:,}"),
        ("submit errors seen by the client (retried)", str(report.submit_errors)),
        ("tasks lost", str(report.lost)),
        ("tasks run before run_at", str(report.early)),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table
