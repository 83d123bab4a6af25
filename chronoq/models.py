"""Domain model: task states, specs and tasks, free of protobuf and database types."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

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

#: A payload of raw bytes: what a task holds unless its submitter says otherwise.
OCTET_STREAM = "application/octet-stream"
#: A payload of JSON text (UTF-8), which SDKs decode for handlers.
APPLICATION_JSON = "application/json"


@dataclass(frozen=True, kw_only=True)
class TaskDefaults:
    """What a task gets for the fields its submitter leaves unset: the one definition that the
    specs and tasks here, the node's settings (``NodeSettings.defaults``) and the SDK follow."""

    max_attempts: int = 3
    backoff_initial: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(minutes=5)
    lease_timeout: timedelta = timedelta(seconds=30)
    misfire_grace: timedelta = timedelta(seconds=60)
    priority: int = 0
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_LATE


#: The built-in task defaults (a node may be configured with others).
TASK_DEFAULTS = TaskDefaults()


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """What a client asks for; validated by ``Limits.check`` before it reaches the store."""

    queue: str
    run_at: datetime
    namespace: str = DEFAULT_NAMESPACE
    payload: bytes = b""
    idempotency_key: str | None = None
    max_attempts: int = TASK_DEFAULTS.max_attempts
    backoff_initial: timedelta = TASK_DEFAULTS.backoff_initial
    backoff_max: timedelta = TASK_DEFAULTS.backoff_max
    lease_timeout: timedelta = TASK_DEFAULTS.lease_timeout
    priority: int = TASK_DEFAULTS.priority
    misfire_policy: MisfirePolicy = TASK_DEFAULTS.misfire_policy
    misfire_grace: timedelta = TASK_DEFAULTS.misfire_grace
    content_type: str = OCTET_STREAM  # what ``payload`` holds, as a MIME type
    # W3C trace context (chronoq.tracecontext.Carrier): sorted (key, value) pairs; () untraced
    trace_context: tuple[tuple[str, str], ...] = ()
    # Queue controls; a key also places the task (chronoq.routing.spec_routing_key).
    concurrency_key: str | None = None
    unique_key: str | None = None
    unique_for: timedelta | None = None  # None: unique while pending
    debounce_key: str | None = None
    debounce: timedelta | None = None
    debounce_max: timedelta | None = None  # None: chronoq.limits.default_debounce_max
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs

    @classmethod
    def of_fields(cls, fields: dict[str, Any]) -> TaskSpec:
        """A spec from a value for every field, as a checker of a whole batch builds them: a
        frozen dataclass sets each field through ``object.__setattr__``, which cost more than
        the rest of a submitted task's checks (1.7 µs against 0.2)."""
        spec = object.__new__(cls)
        spec.__dict__.update(fields)
        return spec


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
    max_attempts: int = TASK_DEFAULTS.max_attempts
    retry_base: int = 0
    priority: int = TASK_DEFAULTS.priority
    backoff_initial: timedelta = TASK_DEFAULTS.backoff_initial
    backoff_max: timedelta = TASK_DEFAULTS.backoff_max
    lease_timeout: timedelta = TASK_DEFAULTS.lease_timeout
    misfire_policy: MisfirePolicy = TASK_DEFAULTS.misfire_policy
    misfire_grace: timedelta = TASK_DEFAULTS.misfire_grace
    lease_until: datetime | None = None
    worker_id: str | None = None
    last_error: str | None = None
    created_at: datetime | None = None
    fired_at: datetime | None = None
    finished_at: datetime | None = None
    fired_by: str | None = None  # the node that fired it, and under which fencing token
    fire_token: int | None = None
    content_type: str = OCTET_STREAM  # what ``payload`` holds, as a MIME type
    trace_context: tuple[tuple[str, str], ...] = ()  # as submitted
    concurrency_key: str | None = None
    unique_key: str | None = None
    unique_until: datetime | None = None  # the end of its unique_for window; None: while pending
    debounce_key: str | None = None
    debounce_until: datetime | None = None  # first submit + debounce_max: the latest run_at
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs

    @property
    def lease_token(self) -> int:
        return self.attempt


@dataclass(frozen=True)
class Lease:
    """A claim on a running task: the task id and the attempt number it was claimed at."""

    task_id: str
    lease_token: int


class LeaseMiss(enum.Enum):
    """Why a lease's heartbeat or ack did not take (``error`` says it in words)."""

    NO_TASK = "no_task"  # no such task in the namespace
    CANCELLED = "cancelled"  # the task was cancelled while it ran
    NOT_RUNNING = "not_running"  # the task is in another state
    STALE = "stale"  # the task runs a later attempt than the lease's


@dataclass(frozen=True)
class HeartbeatOutcome:
    task_id: str
    ok: bool
    cancelled: bool = False
    error: str = ""
    reason: LeaseMiss | None = None  # None when ``ok`` (or when not known, e.g. over the wire)


@dataclass(frozen=True)
class AckOutcome:
    task_id: str
    ok: bool
    error: str = ""
    reason: LeaseMiss | None = None  # None when ``ok`` (or when not known, e.g. over the wire)
    #: The queue of a task with a concurrency key that this ack moved out of RUNNING: a slot
    #: of its key is free (claims waiting on the queue are woken). None otherwise.
    freed: str | None = None


@dataclass(frozen=True)
class SubmitOutcome:
    task: Task
    created: bool


@dataclass(frozen=True)
class QueueCount:
    """Tasks of one queue in one state, and the earliest ``run_at`` among them."""

    queue: str
    state: TaskState
    count: int
    oldest_run_at: datetime | None = None


@dataclass(frozen=True)
class QueueCounts:
    """A namespace's tasks by queue and state, as counted within the request bounds.

    ``capped``: states whose count stopped at the per-state bound (their counts are lower
    bounds). ``truncated``: states with more queues than were answered (the first, in queue
    order).
    """

    counts: list[QueueCount]
    capped: frozenset[TaskState] = frozenset()
    truncated: frozenset[TaskState] = frozenset()


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
    priority: int = TASK_DEFAULTS.priority
    max_attempts: int = TASK_DEFAULTS.max_attempts
    backoff_initial: timedelta = TASK_DEFAULTS.backoff_initial
    backoff_max: timedelta = TASK_DEFAULTS.backoff_max
    lease_timeout: timedelta = TASK_DEFAULTS.lease_timeout


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
