"""Domain model: task states, specs and tasks, free of protobuf and database types."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from chronoq.errors import InvalidArgument
from chronoq.recurrence import CatchUp, Rule


class TaskState(enum.IntEnum):
    """Lifecycle states. The integer values are what the store keeps (``tasks.state``)."""

    SCHEDULED = 0
    READY = 1
    RUNNING = 2
    SUCCEEDED = 3
    DEAD = 4
    CANCELLED = 5
    SKIPPED = 6

    @property
    def terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED, TaskState.SKIPPED)


class MisfirePolicy(enum.IntEnum):
    """What the owner does with a task it fires later than planned (after downtime)."""

    FIRE_LATE = 0
    SKIP = 1


DEFAULT_NAMESPACE = "default"
_NAME = re.compile(r"^[A-Za-z0-9._:-]+$")
MAX_NAME = 128
MAX_IDEMPOTENCY_KEY = 512


def check_name(field_name: str, value: str) -> str:
    """Validate a queue or namespace name and return it."""
    if not value:
        raise InvalidArgument(field_name, "must not be empty")
    if len(value) > MAX_NAME:
        raise InvalidArgument(
            field_name, f"is {len(value)} characters long; the limit is {MAX_NAME}"
        )
    if not _NAME.match(value):
        raise InvalidArgument(field_name, f"{value!r} has characters outside [A-Za-z0-9._:-]")
    return value


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """What a client asks for; validated by ``Limits.check`` before it reaches the store."""

    queue: str
    run_at: datetime
    namespace: str = DEFAULT_NAMESPACE
    payload: bytes = b""
    idempotency_key: str | None = None
    max_attempts: int = 3
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=5)
    lease_timeout: timedelta = timedelta(seconds=30)
    priority: int = 0
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_LATE
    misfire_grace: timedelta = timedelta(seconds=60)


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on what a submit may ask for; a request outside them is refused, never trimmed."""

    max_payload_bytes: int = 256 * 1024
    horizon: timedelta = timedelta(days=366)
    max_attempts_limit: int = 1000
    min_lease_timeout: timedelta = timedelta(seconds=1)
    max_lease_timeout: timedelta = timedelta(hours=24)

    def check(self, spec: TaskSpec, now: datetime) -> TaskSpec:
        """Return ``spec`` if it is acceptable at ``now``, else raise ``InvalidArgument``."""
        check_name("namespace", spec.namespace)
        check_name("queue", spec.queue)
        if spec.run_at.tzinfo is None:
            raise InvalidArgument("run_at", "must carry a time zone")
        if spec.run_at - now > self.horizon:
            raise InvalidArgument(
                "run_at",
                f"{spec.run_at.isoformat()} is beyond the scheduling horizon of "
                f"{_human(self.horizon)} from now",
            )
        if len(spec.payload) > self.max_payload_bytes:
            raise InvalidArgument(
                "payload",
                f"is {len(spec.payload)} bytes; the limit is {self.max_payload_bytes} bytes",
            )
        if spec.idempotency_key is not None and len(spec.idempotency_key) > MAX_IDEMPOTENCY_KEY:
            raise InvalidArgument(
                "idempotency_key", f"is longer than {MAX_IDEMPOTENCY_KEY} characters"
            )
        if not 1 <= spec.max_attempts <= self.max_attempts_limit:
            raise InvalidArgument(
                "max_attempts",
                f"must be between 1 and {self.max_attempts_limit}, got {spec.max_attempts}",
            )
        if spec.backoff_initial < timedelta(0) or spec.backoff_max < spec.backoff_initial:
            raise InvalidArgument("retry", "need 0 <= backoff_initial <= backoff_max")
        if not self.min_lease_timeout <= spec.lease_timeout <= self.max_lease_timeout:
            raise InvalidArgument(
                "lease_timeout",
                f"must be between {_human(self.min_lease_timeout)} "
                f"and {_human(self.max_lease_timeout)}",
            )
        if spec.misfire_grace < timedelta(0):
            raise InvalidArgument("misfire_grace", "must be >= 0")
        return spec


def _human(d: timedelta) -> str:
    secs = int(d.total_seconds())
    if secs % 86400 == 0:
        return f"{secs // 86400} days"
    if secs % 3600 == 0:
        return f"{secs // 3600} hours"
    return f"{secs} seconds"


@dataclass(frozen=True, kw_only=True)
class Task:
    """A task as stored."""

    id: str
    namespace: str
    queue: str
    state: TaskState
    run_at: datetime
    partition: int
    bucket: int
    payload: bytes = b""
    idempotency_key: str | None = None
    attempt: int = 0
    max_attempts: int = 3
    retry_base: int = 0
    priority: int = 0
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=5)
    lease_timeout: timedelta = timedelta(seconds=30)
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_LATE
    misfire_grace: timedelta = timedelta(seconds=60)
    lease_until: datetime | None = None
    worker_id: str | None = None
    last_error: str | None = None
    created_at: datetime | None = None
    fired_at: datetime | None = None
    finished_at: datetime | None = None
    fired_by: str | None = None  # the node that fired it, and under which fencing token
    fire_token: int | None = None

    @property
    def lease_token(self) -> int:
        return self.attempt


@dataclass(frozen=True)
class Lease:
    """A claim on a running task: the task id and the attempt number it was claimed at."""

    task_id: str
    lease_token: int


@dataclass(frozen=True)
class HeartbeatOutcome:
    task_id: str
    ok: bool
    cancelled: bool = False
    error: str = ""


@dataclass(frozen=True)
class AckOutcome:
    task_id: str
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class SubmitOutcome:
    task: Task
    created: bool


@dataclass(frozen=True)
class Page:
    tasks: list[Task] = field(default_factory=list)
    next_token: str = ""


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """A recurring schedule: every occurrence of ``rule`` becomes a task on ``queue``."""

    name: str
    queue: str
    rule: Rule
    namespace: str = DEFAULT_NAMESPACE
    catch_up: CatchUp = CatchUp.LATEST
    start_at: datetime | None = None
    payload: bytes = b""
    priority: int = 0
    max_attempts: int = 3
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=5)
    lease_timeout: timedelta = timedelta(seconds=30)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    id: str
    spec: ScheduleSpec
    partition: int
    paused: bool
    next_fire_at: datetime
    last_fire_at: datetime | None = None
    created_total: int = 0
    skipped_total: int = 0
