"""Submits of specs with a unique or a debounce key, inside the submit's transaction.

Each rule is a unique partial index of migration 0019 (one key, one partition, one shard): no
read decides before a write, so concurrent submits on any nodes agree. The inserts here take
``ON CONFLICT DO NOTHING`` on every index (the plain insert's statement with its conflict
target dropped): a spec whose row is refused is answered by the key's holder, read after.

- **Unique keys** (specs without a debounce key) go together: the ended unique_for windows of
  their keys closed in one statement, their rows inserted in one statement, the holders of the
  refused ones read in one statement (its idempotency key's first task first). A spec whose
  holder is gone by then (it finished meanwhile) is decided alone, below. Two specs of one key
  in a batch: the first is inserted, the second answered by it.
- **Debounce keys** are decided one spec at a time, up to ``KEYED_TRIES`` rounds of: its
  idempotency key's first task; the key's task that has not started, moved later with the new
  payload (``debounce_pending``); the insert; when refused, the idempotency key's or the unique
  key's holder, else another round (a concurrent submit made the key's task: the next round
  moves it).

Rows go in ``lock_order`` (namespace, partition, key), the same in every batch, so two batches
sharing keys wait for each other in one order. ``KEYED_TRIES`` rounds without a decision answer
UNAVAILABLE (safe to retry): only a key changing hands at every round can cause it.
"""

from __future__ import annotations

import dataclasses
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
#: The plain insert's conflict clause, which the keyed inserts widen to every unique index.
IDEMPOTENCY_CONFLICT = (
    "ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
)

#: Builds the insert columns of specs in their partitions (the store's ``_insert_columns``).
Columns = Callable[[list[TaskSpec], datetime, list[int]], tuple[Any, list[list[Any]]]]


@dataclass(frozen=True)
class KeyedRow:
    """What a keyed spec made: the task's row, whether it is new, and whether it is the
    key's pending task moved later by this submit (``debounced``)."""

    row: Any
    created: bool
    debounced: bool = False


def any_conflict(insert: str) -> str:
    """The plain insert statement ``insert`` inserting nothing on a conflict with any unique
    index (idempotency, unique and debounce keys) instead of its idempotency key's only."""
    if insert.count(IDEMPOTENCY_CONFLICT) != 1:
        raise RuntimeError("the insert statement no longer ends with its idempotency clause")
    return insert.replace(IDEMPOTENCY_CONFLICT, "ON CONFLICT DO NOTHING").replace(
        "/* chronoq insert_tasks */", "/* chronoq insert_keyed_tasks */"
    )


@dataclass(frozen=True)
class _Batch:
    conn: Any
    write: Callable[[str], str]
    now: datetime
    columns: Columns
    bucket_seconds: int

    async def insert(
        self, specs: list[TaskSpec], partitions: list[int]
    ) -> tuple[list[Any], dict[Any, Any]]:
        """Insert ``specs`` (nothing for a refused one): their new ids in order, and the rows
        made, by id."""
        ids, cols = self.columns(specs, self.now, partitions)
        rows = await self.conn.fetch(any_conflict(self.write("insert_tasks")), *cols, self.now)
        return list(ids), {r["id"]: r for r in rows}

    async def first_by_key(self, specs: Sequence[TaskSpec]) -> dict[tuple[str, str], Any]:
        """The first task of each spec's idempotency key (the specs that have one)."""
        keys: dict[str, list[str]] = {}
        for s in specs:
            if s.idempotency_key is not None:
                keys.setdefault(s.namespace, []).append(s.idempotency_key)
        found: dict[tuple[str, str], Any] = {}
        for ns, some in keys.items():
            for r in await self.conn.fetch(q("tasks_by_idempotency_key"), ns, some):
                found[(ns, r["idempotency_key"])] = r
        return found

    async def holders(self, specs: Sequence[TaskSpec], partitions: Sequence[int]) -> list[Any]:
        """Per spec, its unique key's holder (None: none now)."""
        rows = await self.conn.fetch(
            q("unique_holders"),
            [s.namespace for s in specs],
            list(partitions),
            [s.unique_key for s in specs],
            [s.unique_for is not None for s in specs],
            self.now,
        )
        found = {r["n"]: r for r in rows}
        return [found.get(i + 1) for i in range(len(specs))]


async def submit_keyed(
    conn: Any,
    write: Callable[[str], str],
    specs: Sequence[TaskSpec],
    partitions: Sequence[int],
    now: datetime,
    columns: Columns,
    bucket_seconds: int,
) -> list[KeyedRow]:
    """Each keyed spec of a batch; per spec, in the batch's order, what it made. ``write``
    names a write statement at the caller's map version."""
    batch = _Batch(conn, write, now, columns, bucket_seconds)
    order = sorted(range(len(specs)), key=lambda i: lock_order(specs[i], partitions[i]))
    unique = [i for i in order if specs[i].debounce_key is None]
    bounced = [i for i in order if specs[i].debounce_key is not None and not specs[i].unique_key]
    made: dict[int, KeyedRow] = {}
    try:
        if unique:
            made.update(await _unique(batch, unique, specs, partitions))
        if bounced:
            made.update(await _debounces(batch, bounced, specs, partitions))
        for i in order:
            if i not in made:
                made[i] = await _one(batch, debounced(specs[i], now), partitions[i])
    except asyncpg.DeadlockDetectedError as exc:
        # Two batches that share keys and idempotency keys in crossed orders: PostgreSQL
        # ended this one, whose transaction is rolled back whole.
        raise StoreUnavailable(
            f"this batch waited for another on shared keys and was ended: {exc}; nothing of "
            "it was written; safe to retry"
        ) from exc
    return [made[i] for i in range(len(specs))]


async def _unique(
    batch: _Batch, at: list[int], specs: Sequence[TaskSpec], partitions: Sequence[int]
) -> dict[int, KeyedRow]:
    """The unique-key specs at positions ``at`` (in lock order), together; those whose
    holder could not be read are left out, for ``_one``."""
    mine = [specs[i] for i in at]
    parts = [partitions[i] for i in at]
    windowed = [k for k, s in enumerate(mine) if s.unique_for is not None]
    if windowed:
        await batch.conn.execute(
            batch.write("close_unique_windows"),
            [mine[k].namespace for k in windowed],
            [parts[k] for k in windowed],
            [mine[k].unique_key for k in windowed],
            batch.now,
        )
    ids, rows = await batch.insert(mine, parts)
    out: dict[int, KeyedRow] = {}
    refused = [k for k, task_id in enumerate(ids) if task_id not in rows]
    for k, task_id in enumerate(ids):
        if task_id in rows:
            out[at[k]] = KeyedRow(rows[task_id], created=True)
    if not refused:
        return out
    firsts = await batch.first_by_key([mine[k] for k in refused])
    left = []
    for k in refused:
        s = mine[k]
        first = None if s.idempotency_key is None else firsts.get((s.namespace, s.idempotency_key))
        if first is not None:
            out[at[k]] = KeyedRow(first, created=False)
        else:
            left.append(k)
    if left:
        held = await batch.holders([mine[k] for k in left], [parts[k] for k in left])
        for k, holder in zip(left, held, strict=True):
            if holder is not None:
                out[at[k]] = KeyedRow(holder, created=False)
    return out


async def _debounces(
    batch: _Batch, at: list[int], specs: Sequence[TaskSpec], partitions: Sequence[int]
) -> dict[int, KeyedRow]:
    """The debounce-key specs at positions ``at`` (in lock order; no unique key), together.
    One key's specs act as if submitted one after the other: the key's task moves to the
    latest of their instants (at most its debounce_until) with the last one's payload, or is
    made from the first with the last one's payload. Every spec of a key answers the task as
    the batch leaves it. A key whose insert is refused is left out, for ``_one``."""
    mine = {i: debounced(specs[i], batch.now) for i in at}
    out: dict[int, KeyedRow] = {}
    firsts = await batch.first_by_key(list(mine.values()))
    keys: dict[tuple[str, int, str], list[int]] = {}
    for i, s in mine.items():
        first = None if s.idempotency_key is None else firsts.get((s.namespace, s.idempotency_key))
        if first is not None:
            out[i] = KeyedRow(first, created=False)
        else:
            assert s.debounce_key is not None
            keys.setdefault((s.namespace, partitions[i], s.debounce_key), []).append(i)
    if not keys:
        return out
    groups = list(keys.values())
    last = [mine[g[-1]] for g in groups]
    latest = [max(mine[i].run_at for i in g) for g in groups]
    moved = await batch.conn.fetch(
        batch.write("debounce_pending_many"),
        [s.namespace for s in last],
        [partitions[g[0]] for g in groups],
        [s.debounce_key for s in last],
        latest,
        batch.bucket_seconds,
        [s.payload for s in last],
        [None if s.content_type == OCTET_STREAM else s.content_type for s in last],
        [tracecontext.to_json(s.trace_context) for s in last],
    )
    for r in moved:
        for i in groups[r["n"] - 1]:
            out[i] = KeyedRow(r, created=False, debounced=True)
    fresh = [k for k, g in enumerate(groups) if g[0] not in out]
    if not fresh:
        return out
    merged = [
        dataclasses.replace(
            mine[groups[k][0]],
            run_at=latest[k],
            payload=last[k].payload,
            content_type=last[k].content_type,
            trace_context=last[k].trace_context,
        )
        for k in fresh
    ]
    ids, rows = await batch.insert(merged, [partitions[groups[k][0]] for k in fresh])
    for k, task_id in zip(fresh, ids, strict=True):
        if task_id in rows:
            first_of_key, *rest = groups[k]
            out[first_of_key] = KeyedRow(rows[task_id], created=True)
            out.update((i, KeyedRow(rows[task_id], created=False)) for i in rest)
    return out


async def _one(batch: _Batch, spec: TaskSpec, partition: int) -> KeyedRow:
    """One keyed spec, in rounds until decided (see the module's docstring)."""
    for _ in range(KEYED_TRIES):
        if spec.debounce_key is not None:
            found = await _debounce(batch, spec, partition)
            if found is not None:
                return found
        if spec.unique_key is not None and spec.unique_for is not None:
            await batch.conn.execute(
                batch.write("close_unique_windows"),
                [spec.namespace],
                [partition],
                [spec.unique_key],
                batch.now,
            )
        (task_id,), rows = await batch.insert([spec], [partition])
        if task_id in rows:
            return KeyedRow(rows[task_id], created=True)
        firsts = await batch.first_by_key([spec])
        if spec.idempotency_key is not None and firsts:
            return KeyedRow(next(iter(firsts.values())), created=False)
        if spec.unique_key is not None:
            (holder,) = await batch.holders([spec], [partition])
            if holder is not None:
                return KeyedRow(holder, created=False)
        # The key's holder went (finished), or another submit made the debounce key's task
        # just now: the next round inserts, or moves that task.
    raise StoreUnavailable(
        f"the task of key {spec.unique_key or spec.debounce_key!r} changed {KEYED_TRIES} times "
        "during this submit; nothing of it was written; safe to retry"
    )


async def _debounce(batch: _Batch, spec: TaskSpec, partition: int) -> KeyedRow | None:
    """The first task of a repeated request, or the key's pending task moved to the spec's
    ``run_at`` (at most its debounce_until) with the spec's payload; None: neither."""
    assert spec.debounce_key is not None
    if spec.idempotency_key is not None:
        firsts = await batch.first_by_key([spec])
        if firsts:
            return KeyedRow(next(iter(firsts.values())), created=False)
    moved = await batch.conn.fetchrow(
        batch.write("debounce_pending"),
        spec.namespace,
        partition,
        spec.debounce_key,
        spec.run_at,
        batch.bucket_seconds,
        spec.payload,
        None if spec.content_type == OCTET_STREAM else spec.content_type,
        tracecontext.to_json(spec.trace_context),
    )
    return None if moved is None else KeyedRow(moved, created=False, debounced=True)
