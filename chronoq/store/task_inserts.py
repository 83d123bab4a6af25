"""The submit statements: a batch of specs turned into column arrays (each all-NULL column
sent once), inserted in chunks of one transaction, repeated keys answered with their first
task, keyed specs (unique, debounce) decided by their own statements."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
from asyncpg.pgproto.pgproto import UUID as PgUUID

from chronoq import submit_keys, tracecontext
from chronoq.buckets import buckets_of
from chronoq.effects import of_submits
from chronoq.errors import StoreUnavailable
from chronoq.limits import (
    default_debounce_max,
)
from chronoq.models import (
    OCTET_STREAM,
    SubmitOutcome,
    TaskSpec,
    TaskState,
)
from chronoq.routing import new_task_id_bytes, spec_routes, submit_partitions
from chronoq.saturating import ms_of, shifted
from chronoq.store.connection import Connected
from chronoq.store.keyed import submit_keyed
from chronoq.store.retired_keys import (
    HISTORY_TRIES,
    check_fresh,
    guarded,
    has_idempotency_keys,
)
from chronoq.store.rows import Accepted, task_of
from chronoq.store.sql import q
from chronoq.timeslice import Timeslice, converted

#: Specs turned into insert columns between two yields to the event loop (a few ms).
COLUMN_SLICE = 200
#: Rows per insert statement: a larger batch is inserted in several statements of one
#: transaction, so the driver's encoding of a statement (~10 µs a row) never holds the event
#: loop for long (a single statement of 10,000 rows held it ~90 ms).
INSERT_CHUNK = 1000
#: The state's column in ``_insert_columns`` (the leased insert decides it itself).
_STATE_COLUMN = 6

R = TypeVar("R")


def _matched(
    ids: Sequence[uuid.UUID],
    specs: Sequence[TaskSpec],
    inserted: Mapping[uuid.UUID, R],
    existing: Mapping[tuple[str, str], R],
) -> list[tuple[R, bool]]:
    """Per spec, what the insert made of it and whether it was created: its own new row,
    or the first task of its (namespace, idempotency_key)."""
    out: list[tuple[R, bool]] = []
    for task_id, s in zip(ids, specs, strict=True):
        if task_id in inserted:
            out.append((inserted[task_id], True))
        else:
            assert s.idempotency_key is not None
            out.append((existing[(s.namespace, s.idempotency_key)], False))
    return out


def _conflicting_keys(
    ids: Sequence[uuid.UUID], specs: Sequence[TaskSpec], inserted: Mapping[uuid.UUID, Any]
) -> dict[str, list[str]]:
    """Per namespace, the idempotency keys of the specs the insert skipped."""
    missing: dict[str, list[str]] = {}
    for task_id, s in zip(ids, specs, strict=True):
        if task_id not in inserted and s.idempotency_key is not None:
            missing.setdefault(s.namespace, []).append(s.idempotency_key)
    return missing


async def _insert_chunked(
    conn: asyncpg.Connection, statement: str, cols: list[list[Any]], now: datetime
) -> list[Any]:
    """``statement`` over the column arrays ``cols``, ``INSERT_CHUNK`` rows at a time, all in
    one transaction (accepted together or not at all); the rows it returns, in order. A
    column of one value stands for every row (see ``_sent_once``)."""
    count = len(cols[0]) if cols else 0
    if count <= INSERT_CHUNK:
        return list(await conn.fetch(statement, *cols, now))
    rows: list[Any] = []
    async with conn.transaction():
        for start in range(0, count, INSERT_CHUNK):
            part = _rows_of(cols, start)
            rows += await conn.fetch(statement, *part, now)
    return rows


K = TypeVar("K", bound=Hashable)


def _each_once(values: list[K], convert: Callable[[K], Any]) -> list[Any]:
    """``[convert(v) for v in values]``, converting each distinct value once."""
    done = {v: convert(v) for v in set(values)}
    return [done[v] for v in values]


def _stored_content_type(content_type: str) -> str | None:
    """NULL for raw bytes, the default."""
    return None if content_type == OCTET_STREAM else content_type


def _control_columns(specs: Sequence[TaskSpec], now: datetime) -> list[list[Any]]:
    """The queue-control columns of ``insert_tasks``: keys, the ends of the unique and
    debounce windows (from ``run_at`` and from the submit), labels as JSON (NULL: none).
    A batch without any (most) gets its NULL columns in one pass over the specs, not six."""
    if all(
        s.concurrency_key is None
        and s.unique_key is None
        and s.debounce_key is None
        and not s.labels
        for s in specs
    ):
        return [[None] * len(specs) for _ in range(6)]
    return [
        [s.concurrency_key for s in specs],
        [s.unique_key for s in specs],
        [None if s.unique_for is None else shifted(s.run_at, s.unique_for) for s in specs],
        [s.debounce_key for s in specs],
        [_debounce_until(s, now) for s in specs],
        _each_once([s.labels for s in specs], tracecontext.to_json),
    ]


def _debounce_until(spec: TaskSpec, now: datetime) -> datetime | None:
    """The latest a debounced task may be postponed to: its first submit + debounce_max."""
    if spec.debounce_key is None or spec.debounce is None:
        return None
    longest = spec.debounce_max or default_debounce_max(spec.debounce)
    return shifted(now, longest)


def _rows_of(cols: list[list[Any]], start: int) -> list[list[Any]]:
    """The columns of rows ``start`` to ``start + INSERT_CHUNK``; a column of one value (the
    value of every row) as it is."""
    end = start + INSERT_CHUNK
    return [cols[0][start:end], *(col if len(col) == 1 else col[start:end] for col in cols[1:])]


def _sent_once(cols: list[list[Any]]) -> list[list[Any]]:
    """The insert columns with each one whose rows all hold one value (the namespace, queue
    and retry policy of most batches) cut to that value: the insert statements spread it over
    every row, and the driver encodes it once instead of once a row. The ids stay whole."""
    return [
        cols[0],
        *(col[:1] if len(col) > 1 and col.count(col[0]) == len(col) else col for col in cols[1:]),
    ]


def _keys_by_namespace(specs: Sequence[TaskSpec]) -> dict[str, list[str]]:
    """Per namespace, the idempotency keys of ``specs`` (each once)."""
    out: dict[str, dict[str, None]] = {}
    for s in specs:
        if s.idempotency_key is not None:
            out.setdefault(s.namespace, {})[s.idempotency_key] = None
    return {ns: list(keys) for ns, keys in out.items()}


async def _insert_counted(
    conn: asyncpg.Connection, statement: str, cols: list[list[Any]], now: datetime
) -> int:
    """``_insert_chunked`` of a statement that returns no rows: how many it inserted."""
    count = len(cols[0]) if cols else 0
    if count <= INSERT_CHUNK:
        return _inserted(await conn.execute(statement, *cols, now))
    inserted = 0
    async with conn.transaction():
        for start in range(0, count, INSERT_CHUNK):
            part = _rows_of(cols, start)
            inserted += _inserted(await conn.execute(statement, *part, now))
    return inserted


def _inserted(status: str) -> int:
    """The rows of an ``INSERT 0 <rows>`` command status."""
    return int(status.rsplit(" ", 1)[1])


class TaskInserts(Connected):
    """Submits: a batch, its ids only, or one due task leased to a waiting stream."""

    def _insert_columns(
        self,
        specs: Sequence[TaskSpec],
        now: datetime,
        partitions: Sequence[int] | None = None,
    ) -> tuple[list[uuid.UUID], list[list[Any]]]:
        """New ids and the column arrays of ``insert_tasks``; due tasks start READY.

        Each task goes to the partition of its (namespace, routing key), else to a random
        one (``chronoq.routing.spec_routes``), unless ``partitions`` places them (a schedule's
        occurrences go to its own); its id carries that partition."""
        if partitions is None:
            partitions = submit_partitions(spec_routes(specs), self.partitions)
        # Time-ordered: a batch's index entries land side by side (see chronoq.ids). As the
        # driver's own UUID type, which it encodes and prints without a detour through ints.
        raw = new_task_id_bytes(partitions, time.time_ns() // 1_000_000)
        ids: list[uuid.UUID] = [PgUUID(b) for b in raw]
        if len(partitions) != len(specs):
            raise ValueError(f"{len(partitions)} partitions for {len(specs)} specs")
        ready, scheduled = int(TaskState.READY), int(TaskState.SCHEDULED)
        run_ats = [s.run_at for s in specs]
        # Column by column, each value a batch shares converted once: a row tuple per task
        # and their transposition cost twice as much (the statement takes columns).
        return ids, [
            ids,
            [s.namespace for s in specs],
            [s.queue for s in specs],
            list(partitions),
            buckets_of(run_ats, self.bucket_seconds),
            run_ats,
            [ready if r <= now else scheduled for r in run_ats],
            [s.priority for s in specs],
            [s.payload for s in specs],
            [s.idempotency_key for s in specs],
            [s.max_attempts for s in specs],
            _each_once([s.backoff_initial for s in specs], ms_of),
            _each_once([s.backoff_max for s in specs], ms_of),
            _each_once([s.lease_timeout for s in specs], ms_of),
            _each_once([s.misfire_policy for s in specs], int),
            _each_once([s.misfire_grace for s in specs], ms_of),
            _each_once([s.content_type for s in specs], _stored_content_type),
            _each_once([s.trace_context for s in specs], tracecontext.to_json),
            *_control_columns(specs, now),
        ]

    async def _insert_columns_sliced(
        self, specs: Sequence[TaskSpec], now: datetime, partitions: Sequence[int] | None = None
    ) -> tuple[list[uuid.UUID], list[list[Any]]]:
        """``_insert_columns`` a slice at a time, yielding between slices (a full batch takes
        milliseconds, which the event loop must not spend in one go); each column of one
        value cut to it (``_sent_once``)."""
        ids: list[uuid.UUID] = []
        cols: list[list[Any]] = []
        timeslice = Timeslice()
        for start in range(0, len(specs), COLUMN_SLICE):
            end = start + COLUMN_SLICE
            part_ids, part_cols = self._insert_columns(
                specs[start:end], now, None if partitions is None else partitions[start:end]
            )
            ids += part_ids
            if not cols:
                cols = part_cols
            else:
                for col, part in zip(cols, part_cols, strict=True):
                    col.extend(part)
            await timeslice.pause_if_due()
        return ids, _sent_once(cols) if cols else cols

    async def submit(
        self, specs: Sequence[TaskSpec], now: datetime, *, partitions: Sequence[int] | None = None
    ) -> list[SubmitOutcome]:
        """Insert tasks durably; a repeated (namespace, idempotency_key) returns the first task.

        A task already due at ``now`` goes straight to READY; the rest wait in their bucket.
        The insert answers with the rows it created; only the first tasks of repeated keys
        are read afterwards. ``partitions`` (one per spec): placed already, by a store of
        shards that routed each spec here (``routing.submit_partitions``).
        """
        if not specs:
            return []
        if any(submit_keys.keyed(s) for s in specs):
            return await self._submit_keyed(specs, now, partitions)
        if len(specs) == 1 and specs[0].idempotency_key is not None:
            return [await self._submit_one(specs[0], now, partitions)]
        if has_idempotency_keys(specs):  # checked against the history (retired_keys)
            matched = await guarded(
                specs, partitions, lambda some, parts: self._rows_checked(some, now, parts), _row
            )
        else:
            ids, cols = await self._insert_columns_sliced(specs, now, partitions)
            async with self.connection() as conn:
                matched = await self._inserted_rows(conn, ids, specs, cols, now)
        tasks = await converted([row for row, _created in matched], task_of)
        return [
            SubmitOutcome(task, created)
            for task, (_row, created) in zip(tasks, matched, strict=True)
        ]

    async def _submit_one(
        self, spec: TaskSpec, now: datetime, partitions: Sequence[int] | None
    ) -> SubmitOutcome:
        """One spec with an idempotency key, in one statement and no transaction: it inserts
        only when its snapshot finds the key in neither tasks nor the history (see
        insert_task_once, a function with one generic plan: this is every single submit not
        handed to a stream); when it inserts nothing, the key's first task, read from both
        (gone meanwhile, its slice dropped: once more)."""
        _ids, cols = self._insert_columns([spec], now, partitions)
        values = [col[0] for col in cols]  # the one row's, as scalars
        async with self.connection() as conn:
            for _ in range(HISTORY_TRIES):
                row = await conn.fetchrow(self._q("insert_task_once"), *values, now)
                if row is not None:
                    return SubmitOutcome(task_of(row), True)
                row = await conn.fetchrow(
                    q("tasks_by_idempotency_key"), spec.namespace, [spec.idempotency_key]
                )
                if row is not None:
                    return SubmitOutcome(task_of(row), False)
        raise StoreUnavailable(
            f"the first task of idempotency key {spec.idempotency_key!r} came and went "
            f"{HISTORY_TRIES} times during the submit; nothing was written; safe to retry"
        )

    async def _rows_checked(
        self, specs: list[TaskSpec], now: datetime, partitions: list[int] | None
    ) -> list[tuple[Any, bool]]:
        """``_inserted_rows`` in a transaction that ends by checking the keys it created
        against the history (``retired_keys.check_fresh``)."""
        ids, cols = await self._insert_columns_sliced(specs, now, partitions)
        async with self.connection() as conn, conn.transaction():
            matched = await self._inserted_rows(conn, ids, specs, cols, now)
            await check_fresh(conn, specs, [created for _row, created in matched])
        return matched

    async def _inserted_rows(
        self,
        conn: Any,
        ids: list[uuid.UUID],
        specs: Sequence[TaskSpec],
        cols: list[list[Any]],
        now: datetime,
    ) -> list[tuple[Any, bool]]:
        """The plain insert of ``specs``: per spec its row and whether it was created (else
        the first task of its idempotency key)."""
        inserted = {
            r["id"]: r for r in await _insert_chunked(conn, self._q("insert_tasks"), cols, now)
        }
        existing: dict[tuple[str, str], Any] = {}
        for ns, keys in _conflicting_keys(ids, specs, inserted).items():
            for r in await conn.fetch(q("tasks_by_idempotency_key"), ns, keys):
                existing[(ns, r["idempotency_key"])] = r
        return _matched(ids, specs, inserted, existing)

    async def _submit_keyed(
        self, specs: Sequence[TaskSpec], now: datetime, partitions: Sequence[int] | None
    ) -> list[SubmitOutcome]:
        """``submit`` of a batch holding unique or debounce keys, in one transaction: its
        plain specs in one insert, then its keyed ones, each decided by its key's indexes
        (``chronoq.store.keyed``)."""
        if has_idempotency_keys(specs):  # checked against the history (retired_keys)
            made = await guarded(
                specs, partitions, lambda some, parts: self._keyed_once(some, now, parts), _row
            )
        else:
            made = await self._keyed_once(list(specs), now, partitions)
        tasks = await converted([row for row, _created in made], task_of)
        return [SubmitOutcome(task, made[i][1]) for i, task in enumerate(tasks)]

    async def _keyed_once(
        self, specs: list[TaskSpec], now: datetime, partitions: Sequence[int] | None
    ) -> list[tuple[Any, bool]]:
        """``_submit_keyed`` in one transaction: per spec its row and whether it is new."""
        parts = (
            list(partitions)
            if partitions is not None
            else submit_partitions(spec_routes(specs), self.partitions)
        )
        plain = [i for i, s in enumerate(specs) if not submit_keys.keyed(s)]
        mine = [i for i, s in enumerate(specs) if submit_keys.keyed(s)]
        made: dict[int, tuple[Any, bool]] = {}
        async with self.connection() as conn, conn.transaction():
            if plain:
                plain_specs = [specs[i] for i in plain]
                ids, cols = await self._insert_columns_sliced(
                    plain_specs, now, [parts[i] for i in plain]
                )
                rows = await self._inserted_rows(conn, ids, plain_specs, cols, now)
                made.update(zip(plain, rows, strict=True))
            decided = await submit_keyed(
                conn,
                self._q,
                [specs[i] for i in mine],
                [parts[i] for i in mine],
                now,
                self._insert_columns,
                self.bucket_seconds,
            )
            made.update((i, (d.row, d.created)) for i, d in zip(mine, decided, strict=True))
            answer = [made[i] for i in range(len(specs))]
            if has_idempotency_keys(specs):
                await check_fresh(conn, specs, [created for _row, created in answer])
        return answer

    async def submit_ids(
        self, specs: Sequence[TaskSpec], now: datetime, *, partitions: Sequence[int] | None = None
    ) -> Accepted:
        """``submit`` that answers only (task id, created) per spec: no rows sent back."""
        if not specs:
            return Accepted()
        if any(submit_keys.keyed(s) for s in specs):
            outcomes = await self._submit_keyed(specs, now, partitions)
            return Accepted([(o.task.id, o.created) for o in outcomes], of_submits(outcomes))
        if has_idempotency_keys(specs):  # checked against the history (retired_keys)
            answered = await guarded(
                specs, partitions, lambda some, parts: self._ids_checked(some, now, parts), _id
            )
            return Accepted.of(specs, [(str(i), created) for i, created in answered], now)
        ids, cols = await self._insert_columns_sliced(specs, now, partitions)
        async with self.connection() as conn:
            count = await _insert_counted(conn, self._q("insert_tasks_counted"), cols, now)
            if count == len(specs):  # every task is new: nothing to look up
                return Accepted.of(specs, [(str(i), True) for i in ids], now)
            # Some keys were taken (by this batch or before it): each key's first task.
            first: dict[tuple[str, str], uuid.UUID] = {}
            for ns, keys in _keys_by_namespace(specs).items():
                for r in await conn.fetch(q("task_ids_by_idempotency_key"), ns, keys):
                    first[(ns, r["idempotency_key"])] = r["id"]
        answer = []
        for task_id, s in zip(ids, specs, strict=True):
            if s.idempotency_key is None:  # nothing to conflict with: inserted
                answer.append((str(task_id), True))
            else:
                winner = first[(s.namespace, s.idempotency_key)]
                answer.append((str(winner), winner == task_id))
        return Accepted.of(specs, answer, now)

    async def _ids_checked(
        self, specs: list[TaskSpec], now: datetime, partitions: list[int] | None
    ) -> list[tuple[uuid.UUID, bool]]:
        """The counted insert of a batch with idempotency keys, in a transaction that ends
        by checking the keys it created against the history: per spec (task id, created)."""
        ids, cols = await self._insert_columns_sliced(specs, now, partitions)
        async with self.connection() as conn, conn.transaction():
            count = await _insert_counted(conn, self._q("insert_tasks_counted"), cols, now)
            if count == len(specs):
                answer = [(i, True) for i in ids]
            else:  # some keys were taken (by this batch or before it): each key's first task
                ours = set(ids)
                first: dict[tuple[str, str], uuid.UUID] = {}
                for ns, keys in _keys_by_namespace(specs).items():
                    for r in await conn.fetch(q("task_ids_by_idempotency_key"), ns, keys):
                        key = (ns, r["idempotency_key"])
                        if r["id"] in ours or key not in first:  # ours, when it is there
                            first[key] = r["id"]
                answer = [
                    (task_id, True)
                    if s.idempotency_key is None
                    else (
                        first[(s.namespace, s.idempotency_key)],
                        first[(s.namespace, s.idempotency_key)] == task_id,
                    )
                    for task_id, s in zip(ids, specs, strict=True)
                ]
            await check_fresh(conn, specs, [created for _id, created in answer])
        return answer

    async def submit_leased(
        self, spec: TaskSpec, now: datetime, worker_id: str, *, partition: int | None = None
    ) -> SubmitOutcome:
        """``submit`` of one task due at ``now``, leased to ``worker_id`` by its own insert:
        RUNNING at attempt 1, as a claim would lease it, with no claim after. A repeated
        (namespace, idempotency_key) answers its first task, not created and not leased.
        ``partition``: placed already (see ``submit``)."""
        if spec.run_at > now:
            raise ValueError("only a task due at once is leased by its submit")
        if submit_keys.keyed(spec):  # its key decides first: submitted READY, for a claim
            (outcome,) = await self._submit_keyed(
                [spec], now, None if partition is None else [partition]
            )
            return outcome
        _ids, cols = self._insert_columns([spec], now, None if partition is None else [partition])
        # The one row's values, without the state (the statement decides it).
        values = [col[0] for i, col in enumerate(cols) if i != _STATE_COLUMN]
        async with self.connection() as conn:
            for _ in range(HISTORY_TRIES):
                # One statement, no transaction: it checks the key in tasks and in the history
                # itself (see insert_task_leased), one round trip from the submit to the push.
                row = await conn.fetchrow(
                    self._q("insert_task_leased"), *values, now, worker_id, *self.lease_bounds_ms
                )
                if row is not None:
                    return SubmitOutcome(task_of(row), True)
                assert spec.idempotency_key is not None  # only a repeated key inserts nothing
                row = await conn.fetchrow(
                    q("tasks_by_idempotency_key"), spec.namespace, [spec.idempotency_key]
                )
                if row is not None:  # its first task, in tasks or in the history
                    return SubmitOutcome(task_of(row), False)
                # Its first task was deleted in between (its history slice dropped): free again.
        raise StoreUnavailable(
            f"the first task of idempotency key {spec.idempotency_key!r} came and went "
            f"{HISTORY_TRIES} times during the submit; nothing was written; safe to retry"
        )


def _row(row: Any) -> Any:
    """A history row as a submit answers it (the row itself)."""
    return row


def _id(row: Any) -> uuid.UUID:
    """A history row as ``submit_ids`` answers it (its id)."""
    task_id: uuid.UUID = row["id"]
    return task_id
