"""Task rows written straight into ``tasks`` with COPY, bypassing the API: large loads in seconds.

Shared by the benchmarks and the lab, which both need millions of pending tasks quickly. The
rows match what ``Store.submit`` writes for a spec with the server's defaults.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS, bucket_of
from chronoq.models import DEFAULT_NAMESPACE, TASK_DEFAULTS, TaskState
from chronoq.routing import id_partition, new_task_ids, submit_partitions

QUEUE = "bench"
NAMESPACE = DEFAULT_NAMESPACE
#: Every benchmark task carries this payload: ~100 B, as in PERFORMANCE.md.
PAYLOAD = b"x" * 100

_MS = timedelta(milliseconds=1)
# The built-in task defaults (chronoq.models.TASK_DEFAULTS), in the store's units.
_MAX_ATTEMPTS = TASK_DEFAULTS.max_attempts
_BACKOFF_INITIAL_MS = TASK_DEFAULTS.backoff_initial // _MS
_BACKOFF_MAX_MS = TASK_DEFAULTS.backoff_max // _MS
_LEASE_TIMEOUT_MS = TASK_DEFAULTS.lease_timeout // _MS
_MISFIRE_GRACE_MS = TASK_DEFAULTS.misfire_grace // _MS

#: Columns a COPY load fills (chronoq/store/migrations/0001_tasks.sql); the rest take defaults.
COPY_COLUMNS = (
    "id",
    "namespace",
    "queue",
    "partition",
    "bucket",
    "run_at",
    "state",
    "payload",
    "max_attempts",
    "backoff_initial_ms",
    "backoff_max_ms",
    "lease_timeout_ms",
    "misfire_grace_ms",
    "created_at",
)


def task_rows(
    count: int,
    first: datetime,
    spread: timedelta,
    *,
    now: datetime,
    partitions: int = DEFAULT_PARTITIONS,
    bucket_seconds: int = DEFAULT_BUCKET_SECONDS,
    among: Sequence[int] | None = None,
) -> Iterator[tuple[Any, ...]]:
    """``count`` SCHEDULED task rows (``COPY_COLUMNS``) with run_at evenly over [first, +spread);
    ``among``: only in these partitions (e.g. the ones a store shard holds)."""
    step = spread / count if count else timedelta(0)
    ids: list[uuid.UUID] = []
    for i in range(count):
        if not ids:  # as the store places and names keyless tasks, a thousand at a time
            n = min(1000, count - i)
            drawn = (
                submit_partitions([(NAMESPACE, None)] * n, partitions)
                if among is None
                else [among[(i + j) % len(among)] for j in range(n)]
            )
            ids = new_task_ids(drawn, time.time_ns() // 1_000_000)[::-1]
        task_id = ids.pop()
        run_at = first + step * i
        yield (
            task_id,
            NAMESPACE,
            QUEUE,
            id_partition(task_id, partitions),
            bucket_of(run_at, bucket_seconds),
            run_at,
            int(TaskState.SCHEDULED),
            PAYLOAD,
            _MAX_ATTEMPTS,
            _BACKOFF_INITIAL_MS,
            _BACKOFF_MAX_MS,
            _LEASE_TIMEOUT_MS,
            _MISFIRE_GRACE_MS,
            now,
        )


async def copy_rows(
    conn: asyncpg.Connection,
    rows: Iterator[tuple[Any, ...]],
    count: int,
    *,
    columns: Sequence[str] = COPY_COLUMNS,
    progress: Callable[[int], None] | None = None,
    chunk: int = 50_000,
) -> None:
    """COPY the first ``count`` of ``rows`` into ``tasks``, one transaction per ``chunk``."""
    done = 0
    while done < count:
        records = [next(rows) for _ in range(min(chunk, count - done))]
        await conn.copy_records_to_table("tasks", records=records, columns=columns)
        done += len(records)
        if progress is not None:
            progress(len(records))
