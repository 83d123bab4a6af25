"""Schedule persistence and the owner's materialisation of occurrences into tasks.

Kept beside ``Store`` (same pool, same named queries) so the task store stays readable.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from chronoq.buckets import partition_of
from chronoq.errors import AlreadyExists, InvalidArgument, ScheduleNotFound
from chronoq.models import Schedule, ScheduleSpec, TaskSpec, check_name
from chronoq.recurrence import CatchUp, Cron, Every, Rule, check, due, next_fire
from chronoq.store.sql import q
from chronoq.store.store import Store

_MS = timedelta(milliseconds=1)


@dataclass
class Materialized:
    created: int = 0
    skipped: int = 0
    schedules: int = 0


def _rule(row: Any) -> Rule:
    if row["cron"] is not None:
        return Cron(row["cron"], row["timezone"])
    return Every(row["interval_ms"] * _MS, row["anchor"])


def _schedule(row: Any) -> Schedule:
    spec = ScheduleSpec(
        name=row["name"],
        queue=row["queue"],
        rule=_rule(row),
        namespace=row["namespace"],
        catch_up=CatchUp(row["catchup"]),
        start_at=row["anchor"],
        payload=bytes(row["payload"]),
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        backoff_initial=row["backoff_initial_ms"] * _MS,
        backoff_max=row["backoff_max_ms"] * _MS,
        lease_timeout=row["lease_timeout_ms"] * _MS,
    )
    return Schedule(
        id=str(row["id"]),
        spec=spec,
        partition=row["partition"],
        paused=row["paused"],
        next_fire_at=row["next_fire_at"],
        last_fire_at=row["last_fire_at"],
        created_total=row["created_total"],
        skipped_total=row["skipped_total"],
    )


def occurrence_key(schedule_id: str, at: datetime) -> str:
    """The idempotency key of one occurrence: the same on every node and every retry."""
    return f"schedule:{schedule_id}:{at.isoformat()}"


class Schedules:
    """Schedules in the task store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def create(self, spec: ScheduleSpec, now: datetime) -> Schedule:
        check_name("namespace", spec.namespace)
        check_name("name", spec.name)
        check_name("queue", spec.queue)
        check(spec.rule)
        if spec.max_attempts < 1:
            raise InvalidArgument("max_attempts", "must be >= 1")
        schedule_id = uuid.uuid4()
        anchor = spec.start_at or now
        first = anchor if isinstance(spec.rule, Every) else next_fire(spec.rule, anchor)
        if first < now:
            first = next_fire(spec.rule, now)
        cron = spec.rule.expression if isinstance(spec.rule, Cron) else None
        interval = spec.rule.interval // _MS if isinstance(spec.rule, Every) else None
        tz = spec.rule.timezone if isinstance(spec.rule, Cron) else "UTC"
        async with self.store.connection() as conn:
            row = await conn.fetchrow(
                q("insert_schedule"),
                schedule_id,
                spec.namespace,
                spec.name,
                partition_of(schedule_id.bytes, self.store.partitions),
                spec.queue,
                cron,
                interval,
                tz,
                anchor,
                int(spec.catch_up),
                spec.payload,
                spec.priority,
                spec.max_attempts,
                spec.backoff_initial // _MS,
                spec.backoff_max // _MS,
                spec.lease_timeout // _MS,
                first,
                now,
            )
        if row is None:
            raise AlreadyExists(f"a schedule named {spec.name!r} exists in {spec.namespace!r}")
        return _schedule(row)

    async def get(self, namespace: str, name: str) -> Schedule:
        async with self.store.connection() as conn:
            row = await conn.fetchrow(q("get_schedule"), namespace, name)
        if row is None:
            raise ScheduleNotFound(name, namespace)
        return _schedule(row)

    async def list_page(
        self, namespace: str, *, page_size: int = 100, after: str = ""
    ) -> list[Schedule]:
        if not 1 <= page_size <= 1000:
            raise InvalidArgument("page_size", "must be between 1 and 1000")
        async with self.store.connection() as conn:
            rows = await conn.fetch(q("list_schedules"), namespace, after, page_size)
        return [_schedule(r) for r in rows]

    async def pause(self, namespace: str, name: str) -> Schedule:
        async with self.store.connection() as conn:
            row = await conn.fetchrow(q("pause_schedule"), namespace, name)
        if row is None:
            raise ScheduleNotFound(name, namespace)
        return _schedule(row)

    async def resume(self, namespace: str, name: str, now: datetime) -> Schedule:
        """Resume from the next occurrence after ``now``: paused time is not caught up."""
        current = await self.get(namespace, name)
        if not current.paused:
            return current
        async with self.store.connection() as conn:
            row = await conn.fetchrow(
                q("resume_schedule"), namespace, name, next_fire(current.spec.rule, now)
            )
        return _schedule(row) if row is not None else await self.get(namespace, name)

    async def delete(self, namespace: str, name: str) -> None:
        async with self.store.connection() as conn:
            row = await conn.fetchrow(q("delete_schedule"), namespace, name)
        if row is None:
            raise ScheduleNotFound(name, namespace)

    async def materialize(
        self,
        owned: Mapping[int, int],
        now: datetime,
        *,
        lookahead: timedelta = timedelta(seconds=60),
        batch: int = 100,
        per_schedule: int = 1000,
    ) -> Materialized:
        """Create the tasks of due occurrences of schedules in owned partitions (fenced).

        Task inserts and the schedule's new position commit together; the idempotency key
        (schedule, fire time) makes a repeat after a failover a no-op.
        """
        done = Materialized()
        if not owned:
            return done
        async with self.store.connection() as conn, conn.transaction():
            rows = await conn.fetch(
                q("due_schedules"), list(owned), list(owned.values()), now + lookahead, batch
            )
            for row in rows:
                plan = due(
                    _rule(row),
                    row["next_fire_at"],
                    now,
                    CatchUp(row["catchup"]),
                    lookahead=lookahead,
                    limit=per_schedule,
                )
                specs = [self._task_spec(row, at) for at in plan.create]
                if specs:
                    _ids, cols = self.store._insert_columns(specs, now)
                    await conn.fetch(q("insert_task_ids"), *cols, now)
                await conn.execute(
                    q("advance_schedule"),
                    row["id"],
                    plan.next_fire_at,
                    plan.create[-1] if plan.create else None,
                    len(plan.create),
                    plan.skipped,
                )
                done.created += len(plan.create)
                done.skipped += plan.skipped
                done.schedules += 1
        return done

    @staticmethod
    def _task_spec(row: Any, at: datetime) -> TaskSpec:
        return TaskSpec(
            queue=row["queue"],
            run_at=at,
            namespace=row["namespace"],
            payload=bytes(row["payload"]),
            idempotency_key=occurrence_key(str(row["id"]), at),
            max_attempts=row["max_attempts"],
            backoff_initial=row["backoff_initial_ms"] * _MS,
            backoff_max=row["backoff_max_ms"] * _MS,
            lease_timeout=row["lease_timeout_ms"] * _MS,
            priority=row["priority"],
        )
