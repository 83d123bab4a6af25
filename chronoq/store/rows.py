"""Stored rows as domain values: tasks, fences, and the enum values no version writes."""

from __future__ import annotations

import enum
import functools
import logging
import random
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from chronoq import tracecontext
from chronoq.effects import NO_EFFECTS, Effects, of_accepted
from chronoq.errors import InvalidArgument
from chronoq.models import OCTET_STREAM, MisfirePolicy, Task, TaskSpec, TaskState
from chronoq.retry import after_failure
from chronoq.saturating import ms_to_delta
from chronoq.store.quarantine import QUARANTINED

log = logging.getLogger("chronoq.store")


@dataclass(frozen=True)
class Fence:
    """A partition's current fencing token and firing watermark."""

    partition: int
    token: int
    watermark: int
    owner: str = ""
    cluster_id: str = ""


@dataclass
class FireResult:
    """What one firing statement did."""

    fired: int = 0
    skipped: int = 0
    ready_by_queue: Counter[tuple[str, str]] = field(default_factory=Counter)
    per_partition: Counter[int] = field(default_factory=Counter)
    lateness: list[float] = field(default_factory=list)  # seconds, of each fired task
    # (stored trace context, lateness) of each fired task that carries a trace context
    traced: list[tuple[str, float]] = field(default_factory=list)
    quarantined: list[Task] = field(default_factory=list)  # due rows set aside as DEAD
    leased: list[Task] = field(default_factory=list)  # fired straight to a worker (RUNNING)
    # Partitions where a namespace filled its share of the batch (or more namespaces had due
    # rows than the batch has rows): they may have more due rows.
    unfinished: set[int] = field(default_factory=set)

    def saturated(self) -> set[int]:
        """Partitions that may have more due rows: worth another statement this tick."""
        return self.unfinished | {t.partition for t in self.quarantined}

    @property
    def effects(self) -> Effects:
        """Its tasks made READY (a hand-off's leased ones and quarantined ones wake nobody)."""
        return Effects(ready=self.ready_by_queue)


class Accepted(list[tuple[str, bool]]):
    """An ids-only submit's answer: (task id, created) per spec, in order, and ``effects``,
    what it did (created tasks due at once were made READY, the later ones SCHEDULED)."""

    def __init__(self, ids: Iterable[tuple[str, bool]] = (), effects: Effects = NO_EFFECTS):
        super().__init__(ids)
        self.effects = effects

    @classmethod
    def of(cls, specs: Sequence[TaskSpec], ids: list[tuple[str, bool]], now: datetime) -> Accepted:
        return cls(ids, of_accepted(specs, ids, now))


def parse_task_id(task_id: str) -> uuid.UUID:
    """A task id as the UUID the tables store; ``InvalidArgument`` for anything else."""
    try:
        return uuid.UUID(task_id)
    except (ValueError, AttributeError, TypeError):
        raise InvalidArgument("id", f"{task_id!r} is not a task id (a UUID)") from None


E = TypeVar("E", bound=enum.IntEnum)
_UNKNOWN_SEEN: set[str] = set()  # task ids whose unknown state was logged already
_UNKNOWN_LOGGED = 1000


def known(kind: type[E], value: Any, fallback: E) -> E:
    """``kind(value)``, or ``fallback`` for a value no version of chronoq writes."""
    try:
        return kind(value)
    except (ValueError, TypeError):
        return fallback


#: Stored durations take few distinct values (the defaults, a queue's settings): each is
#: converted once, not four times per row read.
_stored_delta = functools.lru_cache(maxsize=1024)(ms_to_delta)


def task_of(row: Any) -> Task:
    """A stored row as a ``Task``; never fails on values no version writes, so one bad row
    cannot fail a page, a claim or a reap for the others.

    A state no version knows reads as DEAD (no statement picks the row up again, and a
    requeue takes it like any dead task), with ``last_error`` saying so; a misfire policy no
    version knows reads as FIRE_LATE (what firing does with it); durations are saturated
    into ``[0, LONGEST]``. Instants are clamped to what the driver decodes by the queries.
    """
    state = known(TaskState, row["state"], TaskState.DEAD)
    last_error = row["last_error"]
    if state.value != row["state"]:
        last_error = f"{QUARANTINED}stored state {row['state']} is unknown; reads as DEAD"
        task_id = str(row["id"])
        if task_id not in _UNKNOWN_SEEN and len(_UNKNOWN_SEEN) < _UNKNOWN_LOGGED:
            _UNKNOWN_SEEN.add(task_id)
            log.warning("task %s has unknown state %r; read as DEAD", task_id, row["state"])
    return Task(
        id=str(row["id"]),
        namespace=row["namespace"],
        queue=row["queue"],
        state=state,
        run_at=row["run_at"],
        partition=row["partition"],
        bucket=row["bucket"],
        payload=bytes(row["payload"]),
        idempotency_key=row["idempotency_key"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        retry_base=row["retry_base"],
        priority=row["priority"],
        backoff_initial=_stored_delta(row["backoff_initial_ms"]),
        backoff_max=_stored_delta(row["backoff_max_ms"]),
        lease_timeout=_stored_delta(row["lease_timeout_ms"]),
        misfire_policy=known(MisfirePolicy, row["misfire_policy"], MisfirePolicy.FIRE_LATE),
        misfire_grace=_stored_delta(row["misfire_grace_ms"]),
        lease_until=row["lease_until"],
        worker_id=row["worker_id"],
        last_error=last_error,
        created_at=row["created_at"],
        fired_at=row["fired_at"],
        finished_at=row["finished_at"],
        fired_by=row.get("fired_by"),
        fire_token=row.get("fire_token"),
        content_type=row.get("content_type") or OCTET_STREAM,
        trace_context=tracecontext.from_json(row.get("trace_context")),
        concurrency_key=row.get("concurrency_key"),
        unique_key=row.get("unique_key"),
        unique_until=row.get("unique_until"),
        debounce_key=row.get("debounce_key"),
        debounce_until=row.get("debounce_until"),
        labels=tracecontext.from_json(row.get("labels")),
    )


def retry_decision(
    row: Any,
    now: datetime,
    *,
    horizon: timedelta,
    fatal: bool = False,
    retry_after: timedelta | None = None,
    rng: random.Random | None = None,
) -> tuple[TaskState, datetime]:
    """``retry.after_failure`` on the values of a stored task row."""
    return after_failure(
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        retry_base=row["retry_base"],
        backoff_initial_ms=row["backoff_initial_ms"],
        backoff_max_ms=row["backoff_max_ms"],
        now=now,
        horizon=horizon,
        fatal=fatal,
        retry_after=retry_after,
        rng=rng,
    )
