"""Probes of the store and of processes: counts, transactions, CPU time, COPY loads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from chronoq.bench.raw import (
    BenchError,
    Databases,
    copy_tasks,
)
from chronoq.bench.throughput.results import BACKLOG_FROM
from chronoq.diagnostics.task_rows import NAMESPACE
from chronoq.models import TaskState

#: The benchmark's completed tasks, polled while a run goes on: through the listing indexes
#: (namespace, state, id) of tasks and of the history (where finished tasks retire), so the
#: poll costs the completed rows, not a scan of a backlog.
COMPLETED_SQL = (
    f"SELECT count(*) FROM tasks_with_history WHERE namespace = '{NAMESPACE}'"
    f" AND state = {int(TaskState.SUCCEEDED)}"
)

def progress_bars(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    )


async def load_pending(
    console: Console,
    dsn: str,
    count: int,
    ahead: timedelta = timedelta(hours=1),
    *,
    vacuum: bool = False,
) -> float:
    """COPY ``count`` tasks due over one day, starting ``ahead`` from now.

    ``vacuum``: then VACUUM the table and CHECKPOINT, as autovacuum and the checkpointer would
    have long since done to a backlog built up in service; otherwise autovacuum wakes up for
    the fresh rows, and the checkpointer writes the gigabytes the COPY dirtied, during the
    measurement that follows and charge their work to it.
    """
    with progress_bars(console) as progress:
        bar = progress.add_task(f"COPY {count:,} pending tasks", total=count)
        seconds = await copy_tasks(
            dsn, count, datetime.now(UTC) + ahead, timedelta(days=1),
            progress=lambda n: progress.advance(bar, n),
        )
    if vacuum:
        started = time.perf_counter()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("VACUUM (ANALYZE) tasks")
            await conn.execute("CHECKPOINT")
        finally:
            await conn.close()
        seconds += time.perf_counter() - started
    return seconds


@contextlib.asynccontextmanager
async def measured_on(db: Databases, name: str, dsn: str | None) -> AsyncIterator[str]:
    """The database a measurement runs on: ``dsn``, a table the caller loaded and measures
    again (the previous measurement's tasks are deleted and vacuumed away first, a backlog
    due tomorrow stays), or a fresh one named ``name``."""
    if dsn is not None:
        conn = await asyncpg.connect(dsn)
        try:
            for table in ("tasks", "task_history"):
                await conn.execute(
                    f"DELETE FROM {table} WHERE run_at < $1", datetime.now(UTC) + BACKLOG_FROM / 2
                )
                await conn.execute(f"VACUUM {table}")
        finally:
            await conn.close()
        yield dsn
        return
    async with db.fresh(name) as fresh:
        yield fresh


async def wait_for_count(
    console: Console, dsn: str, sql: str, target: int, label: str, *, within: float
) -> None:
    """Poll ``sql`` (a count) until it reaches ``target``; BenchError after ``within`` s."""
    conn = await asyncpg.connect(dsn)
    try:
        with progress_bars(console) as progress:
            bar = progress.add_task(label, total=target)
            deadline = time.monotonic() + within
            while True:
                n = int(await conn.fetchval(sql))
                progress.update(bar, completed=n)
                if n >= target:
                    return
                if time.monotonic() > deadline:
                    raise BenchError(f"{label}: {n:,} of {target:,} after {within:.0f} s")
                await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def fetchrow(dsn: str, sql: str) -> asyncpg.Record:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(sql)
    finally:
        await conn.close()
    assert row is not None
    return row


async def transactions(dsn: str) -> int:
    """Transactions committed or rolled back in ``dsn``'s database so far."""
    row = await fetchrow(
        dsn,
        "SELECT xact_commit + xact_rollback AS n FROM pg_stat_database"
        " WHERE datname = current_database()",
    )
    return int(row["n"])


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU seconds ``pid`` has used (0 once it has gone); ``reaped``: also
    those of its children that have exited and been waited for (a server's closed backends)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu(postmaster: int) -> float:
    """CPU seconds of a PostgreSQL server so far: the postmaster, its live processes and the
    backends it has reaped (a connection closed during a measurement still counts; one
    that closes after it counts too, which the caller avoids by closing its own first)."""
    return cpu_seconds(postmaster, reaped=True) + sum(
        cpu_seconds(p) for p in descendants(postmaster)
    )


def descendants(pid: int) -> list[int]:
    """``pid``'s processes, children first (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                kids = [int(k) for k in task.read_text().split()]
                out += kids
                todo += kids
    return out


def cpu_now(worker_pids: Sequence[int], postgres: int | None) -> tuple[float, float, float]:
    """CPU seconds so far of this process (node and in-process workers), of the worker
    processes, and of the PostgreSQL server (postmaster and backends; 0 when not ours)."""
    server = server_cpu(postgres) if postgres is not None else 0.0
    return time.process_time(), sum(cpu_seconds(p) for p in worker_pids), server
