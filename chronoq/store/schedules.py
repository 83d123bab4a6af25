"""Schedule persistence and the owner's materialisation of occurrences into tasks.

Kept beside ``Store`` (same pool, same named queries) so the task store stays readable.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from chronoq.errors import (
    AlreadyExists,
    InvalidArgument,
    NamespaceCapReached,
    ScheduleNotFound,
    ScheduleQuotaExceeded,
)
from chronoq.limits import check_name
from chronoq.models import Schedule, ScheduleSpec, TaskSpec
from chronoq.ratelimit import schedule_rate
from chronoq.recurrence import CatchUp, Cron, Every, Rule, check, due, next_fire, occurrences
from chronoq.routing import key_partition, new_task_ids
from chronoq.saturating import ms_to_delta
from chronoq.store.quarantine import POISON, isolate, reason
from chronoq.store.rows import known
from chronoq.store.sql import q
from chronoq.store.store import Store

log = logging.getLogger("chronoq.store")
_MS = timedelta(milliseconds=1)

#: How far back pausing or deleting a schedule looks for occurrences that have not fired: one
#: still SCHEDULED this long after its time is left to fire (its firing is that late).
UNFIRED_PAST = timedelta(minutes=10)
#: The most occurrences pausing or deleting a schedule looks up (one-second schedules over
#: UNFIRED_PAST and a lookahead of up to two hours).
MAX_UNFIRED = 10_000


class Charge(Protocol):
    """Where occurrences are paid for: the namespace's submit quota on the owner's node."""

    def available(self, namespace: str) -> int:
        """Occurrences ``namespace`` can pay for now."""
        ...

    def take(self, namespace: str, n: int) -> None:
        """Pay for ``n`` occurrences of ``namespace`` (at most what ``available`` said)."""
        ...


@dataclass
class Materialized:
    created: int = 0
    skipped: int = 0
    schedules: int = 0
    quarantined: list[tuple[str, str]] = field(default_factory=list)  # (schedule id, reason)
    unpaid: set[str] = field(default_factory=set)  # namespaces whose quota this pass spent

    def add(self, other: Materialized) -> None:
        self.created += other.created
        self.skipped += other.skipped
        self.schedules += other.schedules
        self.quarantined += other.quarantined
        self.unpaid |= other.unpaid


def _rule(row: Any, *, saturate: bool = False) -> Rule:
    """The stored rule; ``saturate`` reads an interval out of range as the nearest one that
    is not (for showing a row), else it raises like the row's data does."""
    if row["cron"] is not None:
        return Cron(row["cron"], row["timezone"])
    interval = ms_to_delta(row["interval_ms"]) if saturate else row["interval_ms"] * _MS
    return Every(interval, row["anchor"])


def _schedule(row: Any) -> Schedule:
    """A stored row as a ``Schedule``; values no version writes read as the nearest safe
    ones (a catch-up policy no version knows as LATEST, durations saturated), so one bad row
    cannot fail a listing. The owner pauses such a row with the reason when it meets it."""
    spec = ScheduleSpec(
        name=row["name"],
        queue=row["queue"],
        rule=_rule(row, saturate=True),
        namespace=row["namespace"],
        catch_up=known(CatchUp, row["catchup"], CatchUp.LATEST),
        start_at=row["anchor"],
        payload=bytes(row["payload"]),
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        backoff_initial=ms_to_delta(row["backoff_initial_ms"]),
        backoff_max=ms_to_delta(row["backoff_max_ms"]),
        lease_timeout=ms_to_delta(row["lease_timeout_ms"]),
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
        paused_reason=row.get("paused_reason"),
    )


class _Shares:
    """One pass's split of each namespace's quota among its due schedules."""

    def __init__(self, charge: Charge | None, rows: Sequence[Any]) -> None:
        self._charge = charge
        self._left: dict[str, int] = {}
        self._share: dict[str, int] = {}
        if charge is None:
            return
        due_per_namespace = Counter(str(row["namespace"]) for row in rows)
        for namespace, n in due_per_namespace.items():
            left = max(0, charge.available(namespace))
            self._left[namespace] = left
            self._share[namespace] = max(1, left // n)

    def of(self, namespace: str, most: int) -> int:
        """Occurrences the next due schedule of ``namespace`` may make (at most ``most``)."""
        if self._charge is None:
            return most
        if namespace not in self._left:  # read one by one after a row could not be read
            self._left[namespace] = max(0, self._charge.available(namespace))
            self._share[namespace] = self._left[namespace]
        return min(most, self._share[namespace], self._left[namespace])

    def paid(self, namespace: str, n: int) -> None:
        if self._charge is not None and n:
            self._charge.take(namespace, n)
            self._left[namespace] -= n


def occurrence_key(schedule_id: str, at: datetime) -> str:
    """The idempotency key of one occurrence: the same on every node and every retry."""
    return f"schedule:{schedule_id}:{at.isoformat()}"


def check_spec(spec: ScheduleSpec) -> None:
    """Refuse a schedule no shard would store (``InvalidArgument`` naming the field)."""
    check_name("namespace", spec.namespace)
    check_name("name", spec.name)
    check_name("queue", spec.queue)
    check(spec.rule)
    if spec.max_attempts < 1:
        raise InvalidArgument("max_attempts", "must be >= 1")


async def _drop_retired(conn: Any, inserted: Sequence[Any]) -> None:
    """Delete again the occurrences just inserted (``inserted``: their ids) whose key has
    its first task in the history. The unique key covers ``tasks`` only, so a position that
    went back over an occurrence that ran and moved there would make and fire it again. One
    statement after a pass's inserts: its snapshot also sees a sweep they waited for."""
    if inserted:
        await conn.execute(q("drop_retired_occurrences"), list(inserted))


class Schedules:
    """Schedules in the task store; ``lookahead``: how far ahead owners make occurrences."""

    def __init__(self, store: Store, *, lookahead: timedelta = timedelta(seconds=60)) -> None:
        self.store = store
        self.lookahead = lookahead

    def _q(self, name: str) -> str:
        """The named write statement, checking the store's holdings at its map version."""
        return q(name, self.store.map_version)

    async def create(
        self,
        spec: ScheduleSpec,
        now: datetime,
        *,
        cap: int | None = None,
        quota: float | None = None,
    ) -> Schedule:
        """Store a new schedule.

        Refused with ``NamespaceCapReached`` when its namespace holds ``cap`` schedules
        already, and with ``ScheduleQuotaExceeded`` when the namespace's active schedules and
        this one could together make more than ``quota`` tasks/s (the submit quota: tasks a
        schedule makes count against it; see ``chronoq.ratelimit.schedule_rate``).
        """
        check_spec(spec)
        # Placed by (namespace, name), like a keyed submit, and its id carries the partition:
        # its occurrences go to the same partition (``_materialize_one``), so a schedule and
        # its tasks commit together wherever that partition lives (docs/design/shards.md).
        partition = key_partition(spec.namespace, spec.name, self.store.partitions)
        (schedule_id,) = new_task_ids([partition], time.time_ns() // 1_000_000)
        anchor = spec.start_at or now
        first = anchor if isinstance(spec.rule, Every) else next_fire(spec.rule, anchor)
        if first < now:
            first = next_fire(spec.rule, now)
        cron = spec.rule.expression if isinstance(spec.rule, Cron) else None
        interval = spec.rule.interval // _MS if isinstance(spec.rule, Every) else None
        tz = spec.rule.timezone if isinstance(spec.rule, Cron) else "UTC"
        rate = schedule_rate(spec.rule)
        async with self.store.connection() as conn:
            row = await conn.fetchrow(
                self._q("insert_schedule"),
                schedule_id,
                spec.namespace,
                spec.name,
                partition,
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
                cap,
                rate,
                quota,
            )
        if row is None or row["id"] is None:
            if cap is not None and row is not None and row["namespace_schedules"] >= cap:
                raise NamespaceCapReached(spec.namespace, "schedules", cap)
            reserved = row["namespace_reserved"] if row is not None else 0.0
            if quota is not None and not reserved + rate <= quota * (1 + 1e-9):
                raise ScheduleQuotaExceeded(spec.namespace, reserved, rate, quota)
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

    async def pause(self, namespace: str, name: str, now: datetime) -> Schedule:
        """Pause, and remove the occurrences made ahead that have not fired."""
        return (await self.pause_once(namespace, name, now, learn=False))[0]

    async def pause_once(
        self, namespace: str, name: str, now: datetime, *, learn: bool = True
    ) -> tuple[Schedule, bool]:
        """``pause``, and whether this call paused it (``learn``: the row is locked first,
        so of two racing pauses one learns it did; a store of shards releases its rate once)."""
        async with self.store.connection() as conn, conn.transaction():
            was = await conn.fetchval(q("lock_schedule"), namespace, name) if learn else None
            row = await conn.fetchrow(self._q("pause_schedule"), namespace, name)
            if row is None:
                raise ScheduleNotFound(name, namespace)
            await self._remove_unfired(conn, row, now)
        return _schedule(row), was is False

    async def resume(
        self, namespace: str, name: str, now: datetime, *, quota: float | None = None
    ) -> Schedule:
        """Resume from the next occurrence after ``now``: paused time is not caught up.

        Refused with ``ScheduleQuotaExceeded`` when the namespace's active schedules and this
        one could together make more than ``quota`` tasks/s, as ``create``.
        """
        current = await self.get(namespace, name)
        if not current.paused:
            return current
        reserved = 0.0
        async with self.store.connection() as conn:
            row = await conn.fetchrow(
                self._q("resume_schedule"),
                namespace,
                name,
                next_fire(current.spec.rule, now),
                quota,
            )
            if row is None and quota is not None:
                reserved = await conn.fetchval(q("schedule_usage"), namespace)
        if row is not None:
            return _schedule(row)
        after = await self.get(namespace, name)
        if after.paused and quota is not None:
            raise ScheduleQuotaExceeded(namespace, reserved, schedule_rate(after.spec.rule), quota)
        return after

    async def delete(self, namespace: str, name: str, now: datetime) -> None:
        """Delete, and remove the occurrences made ahead that have not fired."""
        await self.remove(namespace, name, now)

    async def remove(self, namespace: str, name: str, now: datetime) -> Schedule:
        """``delete``, answering the schedule as it was deleted (whether it was paused, what
        it reserved), which a store of shards gives back to the namespace's counter."""
        async with self.store.connection() as conn, conn.transaction():
            row = await conn.fetchrow(self._q("delete_schedule"), namespace, name)
            if row is None:
                raise ScheduleNotFound(name, namespace)
            await self._remove_unfired(conn, row, now)
        return _schedule(row)

    async def _remove_unfired(self, conn: Any, row: Any, now: datetime) -> int:
        """Delete the schedule's occurrences still waiting to fire for the first time.

        Occurrences are linked to their schedule by their idempotency key (schedule, time):
        the keys of the times the schedule made and may not have fired yet are looked up
        (the unique index), and only never-fired SCHEDULED rows go; a retry waiting its
        backoff has fired and stays. Deleted rather than cancelled, so a resumed schedule
        makes the same occurrences again. A row whose rule cannot be evaluated made none
        that could be found (the owner pauses such a row): it removes nothing.
        """
        try:
            rule = check(_rule(row))
            before = min(row["next_fire_at"], now + self.lookahead + timedelta(minutes=1))
            times = occurrences(rule, now - UNFIRED_PAST, before, MAX_UNFIRED)
        except (InvalidArgument, ValueError, OverflowError, ArithmeticError) as exc:
            log.warning("schedule %s: its occurrences stay (%s)", row["id"], reason(exc))
            return 0
        if not times:
            return 0
        keys = [occurrence_key(str(row["id"]), at) for at in times]
        status = await conn.execute(self._q("delete_unfired_occurrences"), row["namespace"], keys)
        return int(status.split()[-1])

    async def materialize(
        self,
        owned: Mapping[int, int],
        now: datetime,
        *,
        lookahead: timedelta = timedelta(seconds=60),
        batch: int = 100,
        per_schedule: int = 1000,
        charge: Charge | None = None,
        spent: Sequence[str] = (),
    ) -> Materialized:
        """Create the tasks of due occurrences of schedules in owned partitions (fenced).

        Task inserts and the schedule's new position commit together; the idempotency key
        (schedule, fire time) makes a repeat after a failover a no-op. A schedule that cannot
        be read or materialised (a rule or a value no version accepts) is found by halving
        the batch, each try in a savepoint, and paused with the reason (``quarantined``);
        the others are materialised in the same pass.

        With ``charge``, every occurrence is paid for from its namespace's quota as it is
        made; what a namespace can pay is shared evenly among its due schedules (earliest
        occurrences first), and a schedule it cannot pay for stays where it is (its
        namespace in ``unpaid``). Schedules of the namespaces in ``spent`` are not read.
        """
        done = Materialized()
        if not owned:
            return done
        fences = (list(owned), list(owned.values()))
        async with self.store.connection() as conn, conn.transaction():
            due_rows: list[tuple[Any, Any]]
            try:
                async with conn.transaction():  # a row that cannot even be read fails this only
                    rows = await conn.fetch(
                        self._q("due_schedules"), *fences, now + lookahead, batch, list(spent)
                    )
                due_rows = [(r["id"], r) for r in rows]
            except POISON:
                ids = await conn.fetch(
                    self._q("due_schedule_ids"), *fences, now + lookahead, batch, list(spent)
                )
                due_rows = [(r["id"], None) for r in ids]
            shares = _Shares(charge, [row for _id, row in due_rows if row is not None])

            async def write(chunk: Sequence[tuple[Any, Any]]) -> None:
                counts = Materialized()
                inserted: list[Any] = []
                async with conn.transaction():  # a savepoint: a failed try leaves nothing
                    for schedule_id, row in chunk:
                        if row is None:
                            row = await conn.fetchrow(q("schedule_by_id"), schedule_id)
                        if row is None:
                            continue
                        allowed = shares.of(row["namespace"], per_schedule)
                        if allowed < 1:
                            counts.unpaid.add(str(row["namespace"]))
                            continue
                        made = await self._materialize_one(
                            conn, row, now, lookahead, allowed, counts, inserted
                        )
                        # Paid at once: a savepoint tried again after a bad row pays twice
                        # (more than the quota is never made).
                        shares.paid(row["namespace"], made)
                    await _drop_retired(conn, inserted)
                done.add(counts)

            async def poisoned(item: tuple[Any, Any], exc: BaseException) -> None:
                why = reason(exc)
                paused = await conn.fetch(self._q("quarantine_schedule"), *fences, item[0], why)
                if paused:
                    log.warning("paused schedule %s: %s", item[0], why)
                    done.quarantined.append((str(item[0]), why))

            await isolate(due_rows, write, poisoned)
        return done

    async def _materialize_one(
        self,
        conn: Any,
        row: Any,
        now: datetime,
        lookahead: timedelta,
        per_schedule: int,
        counts: Materialized,
        inserted: list[Any],
    ) -> int:
        """Create one schedule's due occurrences and move it on (how many it made; the ids
        of the tasks inserted go to ``inserted``); raises on a bad row."""
        plan = due(
            check(_rule(row)),
            row["next_fire_at"],
            now,
            CatchUp(row["catchup"]),
            lookahead=lookahead,
            limit=per_schedule,
        )
        specs = [self._task_spec(row, at) for at in plan.create]
        if specs:
            _ids, cols = self.store._insert_columns(specs, now, [row["partition"]] * len(specs))
            made = await conn.fetch(self._q("insert_task_ids"), *cols, now)
            inserted.extend(r["id"] for r in made)
        await conn.execute(
            q("advance_schedule"),
            row["id"],
            plan.next_fire_at,
            plan.create[-1] if plan.create else None,
            len(plan.create),
            plan.skipped,
        )
        counts.created += len(plan.create)
        counts.skipped += plan.skipped
        counts.schedules += 1
        return len(plan.create)

    def _task_spec(self, row: Any, at: datetime) -> TaskSpec:
        """An occurrence as a task. Durations are saturated into the node's limits, so a
        schedule row written out of range cannot make tasks that nothing can claim."""
        limits = self.store.limits
        return TaskSpec(
            queue=row["queue"],
            run_at=at,
            namespace=row["namespace"],
            payload=bytes(row["payload"]),
            idempotency_key=occurrence_key(str(row["id"]), at),
            max_attempts=row["max_attempts"],
            backoff_initial=ms_to_delta(row["backoff_initial_ms"], highest=self.store.horizon),
            backoff_max=ms_to_delta(row["backoff_max_ms"], highest=self.store.horizon),
            lease_timeout=ms_to_delta(
                row["lease_timeout_ms"], limits.min_lease_timeout, limits.max_lease_timeout
            ),
            priority=row["priority"],
        )
