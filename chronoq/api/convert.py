"""Protobuf ↔ domain model conversion: the only place both kinds of types meet."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from chronoq.api.v1 import schedules_pb2, tasks_pb2, worker_pb2
from chronoq.errors import InvalidArgument
from chronoq.limits import (
    MAX_LABELS,
    MAX_LEASE_TOKEN,
    MAX_TASK_ID,
    Limits,
    check_name,
    check_text,
)
from chronoq.models import (
    DEFAULT_NAMESPACE,
    OCTET_STREAM,
    Lease,
    MisfirePolicy,
    QueueCount,
    QueueCounts,
    Schedule,
    ScheduleSpec,
    Task,
    TaskDefaults,
    TaskSpec,
    TaskState,
)
from chronoq.recurrence import CatchUp, Cron, Every, Rule
from chronoq.tracecontext import check_carrier

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_US_PER_S = 1_000_000
_NS_PER_US = 1_000
#: protobuf's own bounds of a Timestamp (0001-01-01 to 9999-12-31), in seconds since the epoch.
_TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)


# Timestamps and durations are built from integer microseconds rather than through
# ``FromDatetime``/``ToTimedelta``: the same values at a third of the cost, which a claim or a
# listing pays several times per task.
def to_timestamp(when: datetime | None) -> timestamp_pb2.Timestamp | None:
    if when is None:
        return None
    if when.tzinfo is None:  # naive: UTC, as FromDatetime reads it
        when = when.replace(tzinfo=UTC)
    seconds, us = divmod((when - _EPOCH) // _US, _US_PER_S)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=us * _NS_PER_US)


def to_duration(d: timedelta) -> duration_pb2.Duration:
    seconds, nanos = _duration_fields(d)
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)


@functools.lru_cache(maxsize=1024)
def _shared_duration(d: timedelta) -> duration_pb2.Duration:
    """A Duration to copy into a message field (a field assignment copies it, so the cached
    instance is never changed): a task's durations take few distinct values."""
    return to_duration(d)


@functools.lru_cache(maxsize=1024)  # a task's durations take few distinct values
def _duration_fields(d: timedelta) -> tuple[int, int]:
    us = d // _US
    seconds, rest = divmod(abs(us), _US_PER_S)
    if us < 0:  # seconds and nanos carry the same sign
        seconds, rest = -seconds, -rest
    return seconds, rest * _NS_PER_US


def from_timestamp(field: str, ts: timestamp_pb2.Timestamp) -> datetime:
    """A wire timestamp as an aware datetime; a clear error when it is out of range."""
    low, high = _TIMESTAMP_SECONDS
    if not (low <= ts.seconds <= high and 0 <= ts.nanos < _US_PER_S * _NS_PER_US):
        try:
            return ts.ToDatetime(tzinfo=UTC)  # the same error (or answer) protobuf gives
        except (ValueError, OverflowError) as exc:
            raise InvalidArgument(field, f"is not a valid timestamp ({exc})") from None
    try:
        return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // _NS_PER_US)
    except OverflowError as exc:
        raise InvalidArgument(field, f"is not a valid timestamp ({exc})") from None


def from_duration(
    field: str, d: duration_pb2.Duration, *, allow_negative: bool = False
) -> timedelta:
    try:
        out = d.ToTimedelta()
    except (ValueError, OverflowError) as exc:
        raise InvalidArgument(field, f"is not a valid duration ({exc})") from None
    if out < timedelta(0) and not allow_negative:
        raise InvalidArgument(field, f"must not be negative, got {out}")
    return out


def namespace_of(value: str) -> str:
    """The namespace a request names (empty: ``default``), checked like any name."""
    return check_name("namespace", value) if value else DEFAULT_NAMESPACE


_MISFIRE_FROM_PB: dict[int, MisfirePolicy] = {
    tasks_pb2.MISFIRE_POLICY_UNSPECIFIED: MisfirePolicy.FIRE_LATE,
    tasks_pb2.MISFIRE_POLICY_FIRE_LATE: MisfirePolicy.FIRE_LATE,
    tasks_pb2.MISFIRE_POLICY_SKIP: MisfirePolicy.SKIP,
}


def misfire_policy_from_pb(value: int) -> MisfirePolicy:
    """An enum value the node knows, or ``InvalidArgument``: never stored as a default."""
    try:
        return _MISFIRE_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(
            "misfire_policy",
            f"unknown value {value}; use MISFIRE_POLICY_FIRE_LATE or MISFIRE_POLICY_SKIP",
        ) from None


def _execution_fields(
    pb: tasks_pb2.TaskSpec | schedules_pb2.ScheduleSpec, defaults: TaskDefaults
) -> dict[str, Any]:
    """Retry policy and lease timeout of a task or schedule spec, server defaults if unset."""
    retry = pb.retry
    return {
        "max_attempts": (
            retry.max_attempts if retry.HasField("max_attempts") else defaults.max_attempts
        ),
        "backoff_initial": (
            from_duration("retry.backoff_initial", retry.backoff_initial)
            if retry.HasField("backoff_initial")
            else defaults.backoff_initial
        ),
        "backoff_max": (
            from_duration("retry.backoff_max", retry.backoff_max)
            if retry.HasField("backoff_max")
            else defaults.backoff_max
        ),
        "lease_timeout": (
            from_duration("lease_timeout", pb.lease_timeout)
            if pb.HasField("lease_timeout")
            else defaults.lease_timeout
        ),
    }


def spec_from_pb(
    pb: tasks_pb2.TaskSpec, now: datetime, defaults: TaskDefaults, limits: Limits | None = None
) -> TaskSpec:
    """Build a TaskSpec; ``delay`` is measured from the node's ``now`` (and must be within the
    horizon of ``limits``, so adding it cannot overflow)."""
    which = pb.WhichOneof("when")
    if which == "run_at":
        run_at = from_timestamp("run_at", pb.run_at)
    elif which == "delay":
        run_at = now + (limits or Limits()).check_delay("delay", from_duration("delay", pb.delay))
    elif pb.HasField("debounce"):
        run_at = now  # a debounced task runs at now + debounce, whatever run_at says
    else:
        raise InvalidArgument(
            "run_at", "is required: set run_at (a timestamp) or delay (a duration)"
        )
    return TaskSpec(
        namespace=namespace_of(pb.namespace),
        queue=pb.queue,
        run_at=run_at,
        payload=pb.payload,
        idempotency_key=pb.idempotency_key or None,
        **_execution_fields(pb, defaults),
        priority=pb.priority,
        misfire_policy=misfire_policy_from_pb(pb.misfire_policy),
        misfire_grace=(
            from_duration("misfire_grace", pb.misfire_grace)
            if pb.HasField("misfire_grace")
            else defaults.misfire_grace
        ),
        content_type=pb.content_type or OCTET_STREAM,
        trace_context=check_carrier(pb.trace_context),
        **_control_fields(pb),
    )


def _opt_duration(pb: Any, name: str) -> timedelta | None:
    """A message's optional duration field, None when unset."""
    return from_duration(name, getattr(pb, name)) if pb.HasField(name) else None


def _control_fields(pb: tasks_pb2.TaskSpec) -> dict[str, Any]:
    """A spec's queue controls (``Limits.check`` bounds them); the wire's empty key is none."""
    if len(pb.labels) > MAX_LABELS:  # counted before any entry is looked at
        raise InvalidArgument("labels", f"holds {len(pb.labels)} labels; the limit is {MAX_LABELS}")
    return {
        "concurrency_key": pb.concurrency_key or None,
        "unique_key": pb.unique_key or None,
        "unique_for": _opt_duration(pb, "unique_for"),
        "debounce_key": pb.debounce_key or None,
        "debounce": _opt_duration(pb, "debounce"),
        "debounce_max": _opt_duration(pb, "debounce_max"),
        "labels": tuple(sorted(pb.labels.items())),
    }


def state_policy_to_pb(policy: MisfirePolicy) -> Any:
    if policy is MisfirePolicy.SKIP:
        return tasks_pb2.MISFIRE_POLICY_SKIP
    return tasks_pb2.MISFIRE_POLICY_FIRE_LATE


def state_to_pb(state: TaskState) -> Any:
    return int(state) + 1


def state_from_pb(value: int) -> TaskState | None:
    """None for UNSPECIFIED (every state)."""
    if value == tasks_pb2.TASK_STATE_UNSPECIFIED:
        return None
    try:
        return TaskState(value - 1)
    except ValueError:
        raise InvalidArgument("state", f"unknown task state {value}") from None


def task_to_pb(task: Task) -> tasks_pb2.Task:
    """A task for the wire; on every claim and listing, so kept to one constructor call."""
    pb = tasks_pb2.Task(
        id=task.id,
        namespace=task.namespace,
        queue=task.queue,
        state=state_to_pb(task.state),
        run_at=to_timestamp(task.run_at),
        payload=task.payload,
        idempotency_key=task.idempotency_key or "",
        attempt=task.attempt,
        max_attempts=task.max_attempts,
        priority=task.priority,
        misfire_policy=state_policy_to_pb(task.misfire_policy),
        misfire_grace=_shared_duration(task.misfire_grace),
        lease_timeout=_shared_duration(task.lease_timeout),
        backoff_initial=_shared_duration(task.backoff_initial),
        backoff_max=_shared_duration(task.backoff_max),
        partition=task.partition,
        bucket=task.bucket,
        last_error=task.last_error or "",
        worker_id=task.worker_id or "",
        created_at=to_timestamp(task.created_at),
        fired_at=to_timestamp(task.fired_at),
        lease_until=to_timestamp(task.lease_until),
        finished_at=to_timestamp(task.finished_at),
        content_type=task.content_type,
    )
    if task.trace_context:
        pb.trace_context.update(task.trace_context)
    if (
        task.concurrency_key is not None
        or task.unique_key is not None
        or task.debounce_key is not None
        or task.labels
    ):
        _controls_to_pb(task, pb)
    return pb


def _controls_to_pb(task: Task, pb: tasks_pb2.Task) -> None:
    """A task's queue controls into ``pb`` (rare: kept off the common path)."""
    pb.concurrency_key = task.concurrency_key or ""
    pb.unique_key = task.unique_key or ""
    pb.debounce_key = task.debounce_key or ""
    windows = (("unique_until", task.unique_until), ("debounce_until", task.debounce_until))
    for name, when in windows:
        ts = to_timestamp(when)
        if ts is not None:
            getattr(pb, name).CopyFrom(ts)
    if task.labels:
        pb.labels.update(task.labels)


def _opt_ts(pb: tasks_pb2.Task, name: str) -> datetime | None:
    if not pb.HasField(name):
        return None
    return from_timestamp(name, getattr(pb, name))


def _delta(d: duration_pb2.Duration) -> timedelta:
    """``d.ToTimedelta()`` (microseconds rounded toward zero) without its overhead."""
    return _delta_of(d.seconds, d.nanos)


@functools.lru_cache(maxsize=1024)
def _delta_of(seconds: int, nanos: int) -> timedelta:
    us = nanos // _NS_PER_US if nanos >= 0 else -(-nanos // _NS_PER_US)
    return timedelta(seconds=seconds, microseconds=us)


def task_from_pb(pb: tasks_pb2.Task) -> Task:
    state = state_from_pb(pb.state)
    return Task(
        id=pb.id,
        namespace=pb.namespace,
        queue=pb.queue,
        state=state if state is not None else TaskState.SCHEDULED,
        run_at=from_timestamp("run_at", pb.run_at),
        partition=pb.partition,
        bucket=pb.bucket,
        payload=pb.payload,
        idempotency_key=pb.idempotency_key or None,
        attempt=pb.attempt,
        max_attempts=pb.max_attempts,
        priority=pb.priority,
        backoff_initial=_delta(pb.backoff_initial),
        backoff_max=_delta(pb.backoff_max),
        lease_timeout=_delta(pb.lease_timeout),
        misfire_policy=(
            MisfirePolicy.SKIP
            if pb.misfire_policy == tasks_pb2.MISFIRE_POLICY_SKIP
            else MisfirePolicy.FIRE_LATE
        ),
        misfire_grace=_delta(pb.misfire_grace),
        lease_until=_opt_ts(pb, "lease_until"),
        worker_id=pb.worker_id or None,
        last_error=pb.last_error or None,
        created_at=_opt_ts(pb, "created_at"),
        fired_at=_opt_ts(pb, "fired_at"),
        finished_at=_opt_ts(pb, "finished_at"),
        content_type=pb.content_type or OCTET_STREAM,
        trace_context=tuple(sorted(pb.trace_context.items())),
        concurrency_key=pb.concurrency_key or None,
        unique_key=pb.unique_key or None,
        unique_until=_opt_ts(pb, "unique_until"),
        debounce_key=pb.debounce_key or None,
        debounce_until=_opt_ts(pb, "debounce_until"),
        labels=tuple(sorted(pb.labels.items())),
    )


def lease_from_pb(pb: worker_pb2.Lease) -> Lease:
    if not pb.task_id:
        raise InvalidArgument("lease.task_id", "is required")
    check_text("lease.task_id", pb.task_id, MAX_TASK_ID)
    if not 1 <= pb.lease_token <= MAX_LEASE_TOKEN:
        raise InvalidArgument(
            "lease.lease_token",
            f"must be the attempt number of the claim (1..{MAX_LEASE_TOKEN}), got {pb.lease_token}",
        )
    return Lease(pb.task_id, pb.lease_token)


def lease_to_pb(lease: Lease) -> worker_pb2.Lease:
    return worker_pb2.Lease(task_id=lease.task_id, lease_token=lease.lease_token)


_CATCH_UP_TO_PB = {
    CatchUp.ALL: schedules_pb2.CATCH_UP_ALL,
    CatchUp.LATEST: schedules_pb2.CATCH_UP_LATEST,
    CatchUp.NONE: schedules_pb2.CATCH_UP_NONE,
}


_CATCH_UP_FROM_PB: dict[int, CatchUp] = {
    schedules_pb2.CATCH_UP_UNSPECIFIED: CatchUp.LATEST,
    **{v: k for k, v in _CATCH_UP_TO_PB.items()},
}


def catch_up_to_pb(policy: CatchUp) -> Any:
    return _CATCH_UP_TO_PB[policy]


def catch_up_from_pb(value: int) -> CatchUp:
    """An enum value the node knows, or ``InvalidArgument``: never stored as a default."""
    try:
        return _CATCH_UP_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(
            "catch_up",
            f"unknown value {value}; use CATCH_UP_ALL, CATCH_UP_LATEST or CATCH_UP_NONE",
        ) from None


def schedule_spec_from_pb(
    pb: schedules_pb2.ScheduleSpec, now: datetime, defaults: TaskDefaults
) -> ScheduleSpec:
    """Build a ScheduleSpec; ``Limits.check_schedule`` checks it before anything is written."""
    which = pb.WhichOneof("rule")
    start = from_timestamp("start_at", pb.start_at) if pb.HasField("start_at") else None
    if which == "cron":
        rule: Rule = Cron(pb.cron, pb.timezone or "UTC")
    elif which == "interval":
        rule = Every(from_duration("interval", pb.interval), start or now)
    else:
        raise InvalidArgument(
            "rule", "is required: set cron (an expression) or interval (a duration)"
        )
    return ScheduleSpec(
        name=pb.name,
        queue=pb.queue,
        rule=rule,
        namespace=namespace_of(pb.namespace),
        catch_up=catch_up_from_pb(pb.catch_up),
        start_at=start,
        payload=pb.payload,
        priority=pb.priority,
        **_execution_fields(pb, defaults),
    )


def schedule_spec_to_pb(spec: ScheduleSpec) -> schedules_pb2.ScheduleSpec:
    pb = schedules_pb2.ScheduleSpec(
        namespace=spec.namespace,
        name=spec.name,
        queue=spec.queue,
        payload=spec.payload,
        priority=spec.priority,
        catch_up=_CATCH_UP_TO_PB[spec.catch_up],
        retry=tasks_pb2.RetryPolicy(
            max_attempts=spec.max_attempts,
            backoff_initial=to_duration(spec.backoff_initial),
            backoff_max=to_duration(spec.backoff_max),
        ),
        lease_timeout=to_duration(spec.lease_timeout),
    )
    if isinstance(spec.rule, Cron):
        pb.cron = spec.rule.expression
        pb.timezone = spec.rule.timezone
    else:
        pb.interval.FromTimedelta(spec.rule.interval)
    if spec.start_at is not None:
        pb.start_at.FromDatetime(spec.start_at)
    return pb


def schedule_to_pb(s: Schedule) -> schedules_pb2.Schedule:
    return schedules_pb2.Schedule(
        id=s.id,
        spec=schedule_spec_to_pb(s.spec),
        paused=s.paused,
        next_fire_at=to_timestamp(s.next_fire_at),
        last_fire_at=to_timestamp(s.last_fire_at),
        created_total=s.created_total,
        skipped_total=s.skipped_total,
        partition=s.partition,
        paused_reason=s.paused_reason or "",
    )


def schedule_from_pb(pb: schedules_pb2.Schedule) -> Schedule:
    spec = pb.spec
    start = from_timestamp("start_at", spec.start_at) if spec.HasField("start_at") else None
    rule: Rule
    if spec.WhichOneof("rule") == "cron":
        rule = Cron(spec.cron, spec.timezone or "UTC")
    else:
        rule = Every(
            spec.interval.ToTimedelta(), start or from_timestamp("next_fire_at", pb.next_fire_at)
        )
    return Schedule(
        id=pb.id,
        spec=ScheduleSpec(
            name=spec.name,
            queue=spec.queue,
            rule=rule,
            namespace=spec.namespace,
            catch_up=_CATCH_UP_FROM_PB.get(spec.catch_up, CatchUp.LATEST),
            start_at=start,
            payload=spec.payload,
            priority=spec.priority,
            max_attempts=spec.retry.max_attempts,
            backoff_initial=spec.retry.backoff_initial.ToTimedelta(),
            backoff_max=spec.retry.backoff_max.ToTimedelta(),
            lease_timeout=spec.lease_timeout.ToTimedelta(),
        ),
        partition=pb.partition,
        paused=pb.paused,
        paused_reason=pb.paused_reason or None,
        next_fire_at=from_timestamp("next_fire_at", pb.next_fire_at),
        last_fire_at=from_timestamp("last_fire_at", pb.last_fire_at)
        if pb.HasField("last_fire_at")
        else None,
        created_total=pb.created_total,
        skipped_total=pb.skipped_total,
    )


def queue_counts_to_pb(counts: QueueCounts) -> tasks_pb2.CountTasksResponse:
    return tasks_pb2.CountTasksResponse(
        counts=[
            tasks_pb2.QueueStateCount(
                queue=c.queue,
                state=state_to_pb(c.state),
                count=c.count,
                oldest_run_at=to_timestamp(c.oldest_run_at),
            )
            for c in counts.counts
        ],
        capped=sorted(state_to_pb(s) for s in counts.capped),
        truncated=sorted(state_to_pb(s) for s in counts.truncated),
    )


def queue_counts_from_pb(pb: tasks_pb2.CountTasksResponse) -> QueueCounts:
    def state(value: int) -> TaskState:
        known = state_from_pb(value)
        if known is None:
            raise InvalidArgument("state", "a count without a state")
        return known

    return QueueCounts(
        [
            QueueCount(
                c.queue,
                state(c.state),
                c.count,
                from_timestamp("oldest_run_at", c.oldest_run_at)
                if c.HasField("oldest_run_at")
                else None,
            )
            for c in pb.counts
        ],
        frozenset(state(s) for s in pb.capped),
        frozenset(state(s) for s in pb.truncated),
    )
