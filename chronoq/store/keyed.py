"""Submits of specs with a unique or a debounce key, inside the submit's transaction.

Each keyed spec is decided alone, by the unique partial indexes of migration 0019 (one key,
one partition, one shard): no read decides before a write, so concurrent submits on any
nodes agree. Per spec, up to ``KEYED_TRIES`` rounds of:

1. its idempotency key, when it has one and a debounce key: a repeated request answers its
   first task and moves nothing (the insert's own ON CONFLICT covers the other specs);
2. its debounce key: the key's task that has not started moves later and takes the new
   payload (``debounce_pending``): answered, ``created`` false;
3. its unique_for window: a window of the key that ended is closed (``close_unique_windows``);
4. the insert, under a savepoint. A unique index that refuses it rolls the savepoint back:
   the unique key's holder answers (``unique_holder``); a debounce key inserted meanwhile by
   another submit sends the spec round again (step 2 then moves that task).

A holder that is gone by the time it is read (it finished, or was moved) sends the spec round
again; ``KEYED_TRIES`` rounds without a decision is an outage-like answer (UNAVAILABLE, safe
to retry), which only a key changing hands at every round can cause.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from chronoq import tracecontext
from chronoq.errors import StoreUnavailable
from chronoq.models import OCTET_STREAM, TaskSpec
from chronoq.store.sql import q
from chronoq.submit_keys import KEYED_TRIES, debounced, lock_order

#: The index of a unique key's pending task (a requeue can collide on it too).
UNIQUE_PENDING = "tasks_unique_pending"
#: The indexes whose refusal names a holder of the spec's unique key.
UNIQUE_INDEXES = frozenset({UNIQUE_PENDING, "tasks_unique_window"})
#: The index whose refusal means another submit just made the debounce key's task.
DEBOUNCE_INDEX = "tasks_debounce_pending"

#: Builds the insert columns of one spec in its partition (the store's ``_insert_columns``).
Columns = Callable[[list[TaskSpec], datetime, list[int]], tuple[Any, list[list[Any]]]]


@dataclass(frozen=True)
class KeyedRow:
    """What a keyed spec made: the task's row, whether it is new, and whether it is the
    key's pending task moved later by this submit (``debounced``)."""

    row: Any
    created: bool
    debounced: bool = False


async def submit_keyed(
    conn: Any,
    write: Callable[[str], str],
    specs: Sequence[TaskSpec],
    partitions: Sequence[int],
    now: datetime,
    columns: Columns,
    bucket_seconds: int,
) -> list[KeyedRow]:
    """Each keyed spec of a batch, in ``lock_order``; per spec, in the batch's order, what it
    made. ``write`` names a write statement at the caller's map version."""
    order = sorted(range(len(specs)), key=lambda i: lock_order(specs[i], partitions[i]))
    made: dict[int, KeyedRow] = {}
    try:
        for i in order:
            made[i] = await _one(
                conn, write, debounced(specs[i], now), partitions[i], now, columns, bucket_seconds
            )
    except asyncpg.DeadlockDetectedError as exc:
        # Two batches that share keys and idempotency keys in crossed orders: PostgreSQL
        # ended this one, whose transaction is rolled back whole.
        raise StoreUnavailable(
            f"this batch waited for another on shared keys and was ended: {exc}; nothing of "
            "it was written; safe to retry"
        ) from exc
    return [made[i] for i in range(len(specs))]


async def _one(
    conn: Any,
    write: Callable[[str], str],
    spec: TaskSpec,
    partition: int,
    now: datetime,
    columns: Columns,
    bucket_seconds: int,
) -> KeyedRow:
    for _ in range(KEYED_TRIES):
        if spec.debounce_key is not None:
            found = await _debounce(conn, write, spec, partition, bucket_seconds)
            if found is not None:
                return found
        if spec.unique_key is not None and spec.unique_for is not None:
            await conn.execute(
                write("close_unique_windows"), spec.namespace, partition, spec.unique_key, now
            )
        _ids, cols = columns([spec], now, [partition])
        try:
            async with conn.transaction():  # a savepoint: a refusal undoes this insert only
                row = await conn.fetchrow(write("insert_tasks"), *cols, now)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == DEBOUNCE_INDEX:
                continue  # another submit made the key's task just now: move it
            if exc.constraint_name not in UNIQUE_INDEXES or spec.unique_key is None:
                raise
            holder = await conn.fetchrow(
                q("unique_holder"),
                spec.namespace,
                partition,
                spec.unique_key,
                spec.unique_for is not None,
                now,
            )
            if holder is not None:
                return KeyedRow(holder, created=False)
            continue  # the holder finished meanwhile: try again
        if row is not None:
            return KeyedRow(row, created=True)
        # Nothing inserted and nothing refused: its idempotency key was taken.
        first = await _by_idempotency_key(conn, spec)
        if first is not None:
            return KeyedRow(first, created=False)
    raise StoreUnavailable(
        f"the task of key {spec.unique_key or spec.debounce_key!r} changed {KEYED_TRIES} times "
        "during this submit; nothing of it was written; safe to retry"
    )


async def _debounce(
    conn: Any, write: Callable[[str], str], spec: TaskSpec, partition: int, bucket_seconds: int
) -> KeyedRow | None:
    """Steps 1 and 2: the first task of a repeated request, or the key's pending task moved
    to the spec's ``run_at`` (at most its debounce_until) with the spec's payload."""
    assert spec.debounce_key is not None
    if spec.idempotency_key is not None:
        first = await _by_idempotency_key(conn, spec)
        if first is not None:
            return KeyedRow(first, created=False)
    moved = await conn.fetchrow(
        write("debounce_pending"),
        spec.namespace,
        partition,
        spec.debounce_key,
        spec.run_at,
        bucket_seconds,
        spec.payload,
        None if spec.content_type == OCTET_STREAM else spec.content_type,
        tracecontext.to_json(spec.trace_context),
    )
    return None if moved is None else KeyedRow(moved, created=False, debounced=True)


async def _by_idempotency_key(conn: Any, spec: TaskSpec) -> Any:
    assert spec.idempotency_key is not None
    return await conn.fetchrow(
        q("tasks_by_idempotency_key"), spec.namespace, [spec.idempotency_key]
    )
