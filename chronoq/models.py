"""Domain model: task states, specs and tasks, free of protobuf and database types."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta

# The bounds live in chronoq.limits; re-exported here for the callers that know them as models'.
from chronoq.limits import MAX_IDEMPOTENCY_KEY as MAX_IDEMPOTENCY_KEY
from chronoq.limits import MAX_NAME as MAX_NAME
from chronoq.limits import Limits as Limits
from chronoq.limits import check_name as check_name
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
    paused_reason: str | None = None  # why the owner paused it (a row it could not use)
