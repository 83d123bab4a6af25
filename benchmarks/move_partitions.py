"""Moving partitions between two store shards: how long each phase takes, and the freeze.

Two databases (the caller's empty ones, ``--source-dsn`` and ``--target-dsn``, or two of a
throwaway embedded PostgreSQL, fsync off), one source store holding every partition and one target
holding none. ``--moving`` partitions of ``--per-partition`` pending tasks each are loaded by
COPY, and as many in as many other partitions (the source table is twice what moves). While
the move runs, a writer submits ``--rate`` tasks/s into the moving partitions through the
source store, as a node would, until the cut-over refuses it. Printed: rows/s of the copy and
of each catch-up round, the frozen time of each cut-over group (sized from the last round to
fit the freeze budget, as the driver does; ``--whole``: one group), the clean-up, and the
writer's accepted and refused submits. ``--history`` adds that many finished tasks per moving
partition in the history (``task_history``, where the retention sweep retires them), which
the move copies too; the raw ceiling of copying them (one COPY out of the source into one
COPY into the target, no move) is measured in the same run and printed beside the copy. A
report, not a pass/fail test::

    python benchmarks/move_partitions.py                              # 64 x 20,000 tasks
    python benchmarks/move_partitions.py --per-partition 200000       # 64 x 200,000 (long)
    python benchmarks/move_partitions.py --per-partition 0 --history 1600   # 102,400 history rows
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chronoq.buckets import bucket_of
from chronoq.diagnostics.task_rows import COPY_COLUMNS, NAMESPACE, PAYLOAD, QUEUE
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import StoreUnavailable
from chronoq.models import TASK_DEFAULTS, TaskSpec, TaskState
from chronoq.moves import cut_over_groups
from chronoq.routing import new_task_ids
from chronoq.store import Store
from chronoq.store.move_history import cover, slices
from chronoq.store.move_layout import _columns, _list
from chronoq.store.move_pipe import _both, _Pipe
from chronoq.store.mover import PartitionMove

PARTITIONS = 256
_MS = timedelta(milliseconds=1)


def rows_in(partitions: list[int], per_partition: int, now: datetime) -> Iterator[tuple[Any, ...]]:
    """SCHEDULED rows (``COPY_COLUMNS``), ``per_partition`` in each of ``partitions``, due
    over the next day (nothing fires during the run)."""
    run_at = now + timedelta(hours=1)
    for at in range(0, per_partition, 1000):
        n = min(1000, per_partition - at)
        for p in partitions:
            for task_id in new_task_ids([p] * n, time.time_ns() // 1_000_000):
                when = run_at + timedelta(seconds=(at % 86_400))
                yield (
                    task_id,
                    NAMESPACE,
                    QUEUE,
                    p,
                    bucket_of(when, 60),
                    when,
                    int(TaskState.SCHEDULED),
                    PAYLOAD,
                    TASK_DEFAULTS.max_attempts,
                    TASK_DEFAULTS.backoff_initial // _MS,
                    TASK_DEFAULTS.backoff_max // _MS,
                    TASK_DEFAULTS.lease_timeout // _MS,
                    TASK_DEFAULTS.misfire_grace // _MS,
                    now,
                )


async def load(store: Store, partitions: list[int], per_partition: int) -> float:
    started = time.monotonic()
    rows = rows_in(partitions, per_partition, datetime.now(UTC))
    total = len(partitions) * per_partition
    async with store.connection() as conn:
        done = 0
        while done < total:
            chunk = [next(rows) for _ in range(min(100_000, total - done))]
            await conn.copy_records_to_table("tasks", records=chunk, columns=COPY_COLUMNS)
            done += len(chunk)
        await conn.execute("ANALYZE tasks")
    return time.monotonic() - started


async def load_history(store: Store, partitions: list[int], per_partition: int) -> float:
    """``per_partition`` finished tasks in each of ``partitions``, retired into the history as
    the sweep does (one DELETE feeding one INSERT), into a slice of three days."""
    started = time.monotonic()
    await load(store, partitions, per_partition)
    async with store.connection() as conn:
        lo = await conn.fetchval("SELECT date_trunc('day', now())")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS task_history_bench PARTITION OF task_history FOR VALUES"
            f" FROM ('{lo.isoformat()}') TO ('{(lo + timedelta(days=3)).isoformat()}')"
        )
        await conn.execute(
            "UPDATE tasks SET state = 3, fired_at = now(), finished_at = now(), attempt = 1"
            " WHERE partition = ANY($1::smallint[])",
            partitions,
        )
        await conn.execute(
            "WITH moved AS (DELETE FROM tasks WHERE partition = ANY($1::smallint[]) RETURNING *)"
            " INSERT INTO task_history SELECT moved.*, now() + interval '1 day' FROM moved",
            partitions,
        )
        await conn.execute("VACUUM ANALYZE tasks")
        await conn.execute("ANALYZE task_history")
    return time.monotonic() - started


class _Undo(Exception):
    """Rolls the raw copy back."""


async def raw_history_copy(
    source: Store, target: Store, partitions: list[int]
) -> tuple[int, float]:
    """The ceiling: the partitions' history rows in one COPY out of the source and one COPY
    into the target's history (streamed, binary), rolled back; rows and seconds."""
    async with source.connection() as s, target.connection() as t:
        await cover(t, await slices(s, live_only=True))
        cols = [name for name, _ in await _columns(s, "task_history")]
        pipe = _Pipe(8 << 20)

        async def produce() -> None:
            await s.copy_from_query(
                f"SELECT {_list(cols)} FROM task_history WHERE partition = ANY($1::smallint[])",
                partitions,
                output=pipe.put,
                format="binary",
            )
            await pipe.close()

        started = time.monotonic()
        status = ""
        with contextlib.suppress(_Undo):
            async with t.transaction():
                _, status = await _both(
                    produce(),
                    t.copy_to_table("task_history", source=pipe, columns=cols, format="binary"),
                )
                seconds = time.monotonic() - started
                raise _Undo
    return int(status.split()[-1]), seconds


class Writer:
    """Submits into the moving partitions at ``rate`` tasks/s through the source store."""

    def __init__(self, store: Store, partitions: list[int], rate: float) -> None:
        self.store = store
        self.partitions = partitions
        self.rate = rate
        self.accepted = 0
        self.refused = 0

    async def run(self) -> None:
        batch = max(1, int(self.rate / 20))
        i = 0
        while True:
            now = datetime.now(UTC)
            specs = [TaskSpec(queue=QUEUE, run_at=now + timedelta(hours=2)) for _ in range(batch)]
            parts = [self.partitions[(i + k) % len(self.partitions)] for k in range(batch)]
            i += batch
            try:
                await self.store.submit_ids(specs, now, partitions=parts)
                self.accepted += batch
            except StoreUnavailable:  # PartitionMoved from the cut-over on
                self.refused += batch
            await asyncio.sleep(batch / self.rate)


def rate(rows: int, seconds: float) -> str:
    return f"{rows:,} rows in {seconds:.2f} s ({rows / seconds:,.0f} rows/s)" if seconds else ""


async def run(
    source_dsn: str,
    target_dsn: str,
    moving: int,
    per_partition: int,
    rps: float,
    whole: bool = False,
    history: int = 0,
) -> None:
    source = await Store.connect(source_dsn, partitions=PARTITIONS, holds=None)
    target = await Store.connect(target_dsn, partitions=PARTITIONS, holds=())
    try:
        parts = list(range(moving))
        others = list(range(PARTITIONS - moving, PARTITIONS))
        if history:  # first: it finishes every task of these partitions
            took = await load_history(source, parts + others, history)
            print(
                f"loaded {2 * moving * history:,} finished tasks into the history in {took:.1f} s"
            )
            rows, seconds = await raw_history_copy(source, target, parts)
            print(f"raw ceiling, history of the moving partitions: {rate(rows, seconds)}")
        took = await load(source, parts + others, per_partition)
        print(f"loaded {2 * moving * per_partition:,} tasks in {took:.1f} s")
        move = PartitionMove(source, target, parts, "m" + uuid.uuid4().hex[:12], 1)
        writer = Writer(source, parts, rps)
        writing = asyncio.create_task(writer.run())
        try:
            started = time.monotonic()
            await move.prepare()
            print(f"prepare (move index, concurrently): {time.monotonic() - started:.2f} s")
            started = time.monotonic()
            copied = await move.copy()
            print(f"copy: {rate(copied, time.monotonic() - started)}")
            for n in range(1, 6):
                changed = await move.catch_up()
                last = move.last_round
                assert last is not None
                print(
                    f"catch-up {n}: {changed:,} changed, {last.listed:,} listed in "
                    f"{last.seconds:.2f} s ({last.rows_per_second:,.0f} rows/s)"
                )
                if changed <= rps * last.seconds / 2:
                    break
            last = move.last_round
            assert last is not None
            groups = (
                [tuple(parts)]
                if whole
                else cut_over_groups(parts, last.listed, last.seconds, move.freeze_budget)
            )
            for version, group in enumerate(groups, start=2):
                part = move if len(groups) == 1 else move.group(group)
                cut = await part.cut_over(version)
                print(
                    f"cut-over of {len(group)} partitions: frozen {cut.frozen_seconds:.3f} s, "
                    f"{cut.changed:,} rows in the last round"
                )
        finally:
            writing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writing
        print(
            f"writer: {writer.accepted:,} accepted, {writer.refused:,} refused "
            "(a node would retry those on the target)"
        )
        started = time.monotonic()
        deleted = await move.clean_up()
        print(f"clean-up: {rate(deleted, time.monotonic() - started)}")
    finally:
        await source.close()
        await target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dsn", help="an empty database for the source shard")
    parser.add_argument("--target-dsn", help="an empty database for the target shard")
    parser.add_argument("--moving", type=int, default=64)
    parser.add_argument("--per-partition", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=200, help="submits/s during the move")
    parser.add_argument(
        "--history", type=int, default=0,
        help="finished tasks per moving partition in the history, copied by the move too",
    )  # fmt: skip
    parser.add_argument(
        "--whole", action="store_true",
        help="cut every partition over at once (default: in groups sized to the freeze budget,"
        " as the move driver does)",
    )  # fmt: skip
    args = parser.parse_args()
    sizes = (args.moving, args.per_partition, args.rate, args.whole, args.history)
    if args.source_dsn and args.target_dsn:
        asyncio.run(run(args.source_dsn, args.target_dsn, *sizes))
        return
    with tempfile.TemporaryDirectory(prefix="chronoq-move-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata", durable=False)
        server.start()
        try:
            source, target = (server.create_database(n) for n in ("source", "target"))
            asyncio.run(run(source, target, *sizes))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
