"""The bounds on every request field, and the checks that apply them, in one place. Pure.

A node accepts only what every statement and background loop can process later: a duration
that cannot overflow when added to a time, a time inside the scheduling horizon, a string
without NUL (PostgreSQL text cannot hold one) and of a bounded length, a repeated field short
enough to handle without stalling the node. Tasks and schedules go through the same checks.
A request outside the bounds is refused with ``InvalidArgument`` naming the field; nothing is
trimmed silently, except a failure message, which is a crashed handler's free text and is
cleaned instead (refusing it would leave the task RUNNING until its lease expires).

The README's API section lists these limits; keep the two in step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from chronoq import tracecontext
from chronoq.errors import ConfigError, InvalidArgument, shown
from chronoq.models import OCTET_STREAM
from chronoq.recurrence import Cron
from chronoq.recurrence import check as check_rule

if TYPE_CHECKING:
    from collections.abc import Iterable

    from chronoq.models import ScheduleSpec, Task, TaskSpec

# ---------------------------------------------------------------- lengths (characters)

#: Queue, namespace and schedule names: 1..128 characters of ``NAME_CHARACTERS``.
MAX_NAME = 128
NAME_CHARACTERS = "[A-Za-z0-9._:-]"
_NAME = re.compile(NAME_CHARACTERS + "+")
MAX_IDEMPOTENCY_KEY = 512
MAX_WORKER_ID = 256
#: A task id is a UUID (36 characters; braces or a ``urn:uuid:`` prefix still fit).
MAX_TASK_ID = 64
MAX_PAGE_TOKEN = 256
#: A failure message is kept as ``last_error`` up to this many characters.
MAX_ERROR_MESSAGE = 4000
MAX_CRON = 256
MAX_TIMEZONE = 64
#: A payload's content type: a MIME type ``type/subtype``, parameters allowed
#: (``text/plain; charset=utf-8``), at most this many characters. Anything else is refused:
#: a worker in any language must be able to switch on it.
MAX_CONTENT_TYPE = 128
_MIME_TOKEN = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*"
_CONTENT_TYPE = re.compile(
    rf"{_MIME_TOKEN}/{_MIME_TOKEN}(\s*;\s*{_MIME_TOKEN}=(?:{_MIME_TOKEN}|\"[^\"\\\x00-\x1f]*\"))*"
)

#: A task's concurrency, unique and debounce keys: 1..``MAX_CONTROL_KEY`` characters, no NUL.
MAX_CONTROL_KEY = 128
#: Labels per task, and the bounds of each: a key of ``LABEL_KEY_CHARACTERS`` (as a metric or
#: Kubernetes label key), a value of free text.
MAX_LABELS = 16
MAX_LABEL_KEY = 63
LABEL_KEY_CHARACTERS = "[A-Za-z0-9._/-]"
_LABEL_KEY = re.compile(LABEL_KEY_CHARACTERS + "+")
MAX_LABEL_VALUE = 256

# ---------------------------------------------------------------- durations of queue controls

#: A unique key's window after the first task's run_at (unset: while the task is pending).
MAX_UNIQUE_FOR = timedelta(days=30)
#: How long a debounced task waits after the last submit of its key.
MAX_DEBOUNCE = timedelta(days=1)
#: How long after its first submit a debounced task may be postponed at most; unset, it is
#: ``DEBOUNCE_MAX_FACTOR`` times the debounce, at most ``MAX_DEBOUNCE_MAX``.
MAX_DEBOUNCE_MAX = timedelta(days=7)
DEBOUNCE_MAX_FACTOR = 10

# ---------------------------------------------------------------- numbers

#: Lease tokens are attempt numbers, which the store keeps as 32-bit integers.
MAX_LEASE_TOKEN = 2**31 - 1
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
#: Queue dispatch limits, tasks per second and tasks at once.
MAX_QUEUE_RATE = 1_000_000.0
MAX_QUEUE_BURST = 1_000_000.0
#: Queue settings (SetQueue): RUNNING tasks per concurrency key at once, and claims per key and
#: second; 0 is no limit.
MAX_RUNNING_PER_KEY = 10_000
MAX_STARTS_PER_KEY = 100_000.0
#: Queues with settings (paused, or limited per key) one namespace may hold: every node reads
#: them all into its dispatch gate, and a store of shards keeps a copy on every shard.
MAX_QUEUE_SETTINGS_PER_NAMESPACE = 1000
#: READY tasks a resume's misfire pass examines per statement (it walks the namespace's READY
#: tasks in id order, so each statement reads at most this many, whatever the backlog).
RESUME_SKIP_BATCH = 1000
#: READY tasks a resume counts to wake claims for (at most; the probe finds the rest).
RESUME_WAKE_COUNT = 1000
#: Upcoming buckets a status call counts (a day of one-minute buckets).
MAX_STATUS_BUCKETS = 1440
#: Nothing is scheduled before the Unix epoch (a year-1 time is a bug, not a plan).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)

# ---------------------------------------------------------------- repeated fields, per call

#: Leases per Heartbeat or CompleteBatch: a worker at full concurrency sends far fewer.
MAX_LEASES_PER_CALL = 1000
#: Queue names per Claim.
MAX_QUEUES_PER_CLAIM = 100
#: Tasks per Claim.
MAX_CLAIM_TASKS = 1000
#: Label pairs a listing or a bulk operation filters by (all must match).
MAX_LABEL_FILTERS = 16
#: Tasks one bulk call (CancelWhere, RequeueWhere, RunNowWhere) changes or counts at most;
#: it answers where it stopped, and the caller calls again.
MAX_BULK_TASKS = 100_000
#: Tasks one statement of a bulk call changes (its own transaction: row locks held briefly).
BULK_BATCH = 1000
#: Index entries one statement of a bulk call or of a filtered listing reads at most: a
#: filter that matches few of the namespace's tasks costs bounded statements, not a scan.
MAX_FILTER_EXAMINED = 10_000
#: Seconds one bulk call works at most before it answers where it stopped.
BULK_DEADLINE_S = 20.0
#: Bulk calls of one namespace running at once on a node (one more: RESOURCE_EXHAUSTED).
MAX_BULK_PER_NAMESPACE = 2
#: Credits a worker stream may have outstanding (tasks the node may push it unasked).
MAX_STREAM_CREDITS = 10_000
#: Task ids per Requeue.
MAX_REQUEUE_IDS = 1000
#: Tasks or schedules per page of a list call.
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
#: Index entries a CountTasks reads per state (a count that reaches it is a lower bound): an
#: index-only scan of this many entries is a few milliseconds, whatever the backlog.
MAX_COUNTED_TASKS = 100_000
#: Queues a CountTasks answers per state (in queue order): bounds its answer's bytes.
MAX_COUNTED_QUEUES = 1000
#: Queues a partition's kept counts list per (namespace, state), in queue order (the rest
#: summed in one row): bounds the counts table and what a QueueCounts sums per partition. A
#: QueueCounts answers as many, so the queues it lists are exact.
MAX_KEPT_QUEUES = 1000
#: Queues a QueueCounts may name (a scaler asks for its own few).
MAX_COUNTS_QUEUES = 100
#: Tasks a QueueCounts with a label key reads per state (the label is not in an index): its
#: counts per label value are lower bounds past it.
MAX_LABEL_COUNTED_TASKS = 10_000
#: (queue, label value) pairs a QueueCounts answers.
MAX_LABEL_TALLIES = 1000

# ---------------------------------------------------------------- bytes, per answer

#: The one byte budget of everything a node sends carrying tasks: a listing page, a claim's
#: answer (``Claim``, or riding on ``CompleteBatch``), a push on a worker stream, a full
#: ``SubmitBatch`` answer, and a worker stream's tasks claimed but not yet written. It fits in
#: the 4 MiB a gRPC client accepts by default with room for the rest of the message, so no
#: answer is built that a client with default settings cannot take; the statements that lease
#: tasks stop at it (always one task, so a task at the payload limit still goes).
MAX_ANSWER_BYTES = 3 * 1024 * 1024
#: What a task costs in an answer besides its variable-length fields: id, times, numbers and
#: framing (a generous upper bound, so a sum of tasks never underestimates the message).
TASK_FIXED_BYTES = 256
#: The largest payload a node may be configured to accept: a task at it still fits in one
#: answer with every other field at its limit.
MAX_PAYLOAD_LIMIT = MAX_ANSWER_BYTES - 64 * 1024
#: A worker stream must send its opening message within this many seconds of its start, or
#: it is closed (no stream sits open unauthenticated and uncounted).
STREAM_OPEN_DEADLINE = 5.0
#: A message written on a worker stream must be taken by the worker (the transport's flow
#: control) within this many seconds, or the stream is closed and the tasks it had not
#: delivered are given back at once, without using an attempt.
STREAM_WRITE_DEADLINE = 5.0


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on what a submit or a schedule may ask for; settable per node.

    A request outside them is refused, never trimmed. Every duration that postpones a task
    (delay, backoff, retry_after, misfire grace, a schedule's interval) is at most the
    ``horizon``, so no sum of a time and a duration leaves the range of a timestamp.
    """

    max_payload_bytes: int = 256 * 1024
    horizon: timedelta = timedelta(days=366)
    max_attempts_limit: int = 1000
    min_lease_timeout: timedelta = timedelta(seconds=1)
    max_lease_timeout: timedelta = timedelta(hours=24)
    min_interval: timedelta = timedelta(seconds=1)

    def __post_init__(self) -> None:
        if not 1 <= self.max_payload_bytes <= MAX_PAYLOAD_LIMIT:
            raise ConfigError(
                f"max_payload_bytes must be between 1 and {MAX_PAYLOAD_LIMIT} (a task must fit "
                f"in one answer of {MAX_ANSWER_BYTES} bytes), got {self.max_payload_bytes}"
            )

    def check(self, spec: TaskSpec, now: datetime) -> TaskSpec:
        """Return ``spec`` if it is acceptable at ``now``, else raise ``InvalidArgument``."""
        check_name("namespace", spec.namespace)
        check_name("queue", spec.queue)
        self.check_time("run_at", spec.run_at, now)
        self.check_payload(spec.payload)
        check_content_type(spec.content_type)
        if spec.idempotency_key is not None:
            check_text("idempotency_key", spec.idempotency_key, MAX_IDEMPOTENCY_KEY)
        self._check_execution(
            spec.max_attempts, spec.backoff_initial, spec.backoff_max, spec.lease_timeout
        )
        check_range("priority", spec.priority, MIN_PRIORITY, MAX_PRIORITY)
        self.check_delay("misfire_grace", spec.misfire_grace)
        check_controls(spec)
        return spec

    def check_schedule(self, spec: ScheduleSpec, now: datetime) -> ScheduleSpec:
        """The same bounds for a schedule, plus its rule: a valid cron expression in an IANA
        zone that has a next occurrence, or an interval within ``min_interval`` and the
        horizon."""
        check_name("namespace", spec.namespace)
        check_name("name", spec.name)
        check_name("queue", spec.queue)
        if spec.start_at is not None:
            self.check_time("start_at", spec.start_at, now)
        rule = spec.rule
        if isinstance(rule, Cron):
            check_text("cron", rule.expression, MAX_CRON)
            check_text("timezone", rule.timezone, MAX_TIMEZONE)
        else:
            self.check_delay("interval", rule.interval, low=self.min_interval)
        check_rule(rule, now)
        self.check_payload(spec.payload)
        self._check_execution(
            spec.max_attempts, spec.backoff_initial, spec.backoff_max, spec.lease_timeout
        )
        check_range("priority", spec.priority, MIN_PRIORITY, MAX_PRIORITY)
        return spec

    def _check_execution(
        self,
        max_attempts: int,
        backoff_initial: timedelta,
        backoff_max: timedelta,
        lease_timeout: timedelta,
    ) -> None:
        check_range("max_attempts", max_attempts, 1, self.max_attempts_limit)
        self.check_delay("retry.backoff_initial", backoff_initial)
        self.check_delay("retry.backoff_max", backoff_max)
        if backoff_max < backoff_initial:
            raise InvalidArgument("retry", "need 0 <= backoff_initial <= backoff_max")
        if not self.min_lease_timeout <= lease_timeout <= self.max_lease_timeout:
            raise InvalidArgument(
                "lease_timeout",
                f"must be between {human(self.min_lease_timeout)} "
                f"and {human(self.max_lease_timeout)}, got {lease_timeout}",
            )

    def check_delay(
        self, field: str, value: timedelta, *, low: timedelta = timedelta(0)
    ) -> timedelta:
        """A duration that postpones something: between ``low`` and the horizon."""
        if value < low:
            raise InvalidArgument(field, f"must be at least {human(low)}, got {value}")
        if value > self.horizon:
            raise InvalidArgument(
                field, f"is {value}; the limit is the scheduling horizon, {human(self.horizon)}"
            )
        return value

    def check_time(self, field: str, when: datetime, now: datetime) -> datetime:
        """An aware time from the epoch up to the horizon from ``now``."""
        if when.tzinfo is None:
            raise InvalidArgument(field, "must carry a time zone")
        if when < EARLIEST:
            raise InvalidArgument(field, f"{when.isoformat()} is before {EARLIEST.isoformat()}")
        if when - now > self.horizon:
            raise InvalidArgument(
                field,
                f"{when.isoformat()} is beyond the scheduling horizon of "
                f"{human(self.horizon)} from now",
            )
        return when

    def check_payload(self, payload: bytes) -> bytes:
        if len(payload) > self.max_payload_bytes:
            raise InvalidArgument(
                "payload",
                f"is {len(payload)} bytes; the limit is {self.max_payload_bytes} bytes",
            )
        return payload


def check_name(field: str, value: str) -> str:
    """A queue, namespace or schedule name: 1..``MAX_NAME`` of ``NAME_CHARACTERS``, whole."""
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > MAX_NAME:
        raise InvalidArgument(field, f"is {len(value)} characters long; the limit is {MAX_NAME}")
    if _NAME.fullmatch(value) is None:
        raise InvalidArgument(field, f"{shown(value)} has characters outside {NAME_CHARACTERS}")
    return value


def check_controls(spec: TaskSpec) -> None:
    """A spec's queue controls: its keys, their durations (each only with its key) and labels."""
    for field, key in (
        ("concurrency_key", spec.concurrency_key),
        ("unique_key", spec.unique_key),
        ("debounce_key", spec.debounce_key),
    ):
        if key is not None:
            check_control_key(field, key)
    if spec.unique_for is not None:
        if spec.unique_key is None:
            raise InvalidArgument("unique_for", "needs a unique_key (the key it keeps unique)")
        check_window("unique_for", spec.unique_for, MAX_UNIQUE_FOR)
    _check_debounce(spec)
    if spec.labels:
        check_labels(spec.labels)


def _check_debounce(spec: TaskSpec) -> None:
    """A debounce needs its key and a key its debounce; debounce_max in [debounce, 7 days]."""
    if spec.debounce_key is None:
        for field, value in (("debounce", spec.debounce), ("debounce_max", spec.debounce_max)):
            if value is not None:
                raise InvalidArgument(field, "needs a debounce_key (the key it debounces)")
        return
    if spec.debounce is None:
        raise InvalidArgument("debounce", "is required with a debounce_key (how long to wait)")
    check_window("debounce", spec.debounce, MAX_DEBOUNCE)
    if spec.debounce_max is not None and not (
        spec.debounce <= spec.debounce_max <= MAX_DEBOUNCE_MAX
    ):
        raise InvalidArgument(
            "debounce_max",
            f"must be between the debounce ({spec.debounce}) and {human(MAX_DEBOUNCE_MAX)}, "
            f"got {spec.debounce_max}",
        )


def check_control_key(field: str, value: str) -> str:
    """A concurrency, unique or debounce key: 1..``MAX_CONTROL_KEY`` characters, no NUL."""
    if not value:
        raise InvalidArgument(field, "must not be empty (leave it unset for none)")
    return check_text(field, value, MAX_CONTROL_KEY)


def check_window(field: str, value: timedelta, high: timedelta) -> timedelta:
    """A duration of a queue control: more than 0, at most ``high``."""
    if not timedelta(0) < value <= high:
        raise InvalidArgument(
            field, f"must be more than 0 and at most {human(high)}, got {value}"
        )
    return value


def default_debounce_max(debounce: timedelta) -> timedelta:
    """A debounce's ``debounce_max`` when unset: ``DEBOUNCE_MAX_FACTOR`` times it, capped."""
    return min(debounce * DEBOUNCE_MAX_FACTOR, MAX_DEBOUNCE_MAX)


def check_labels(labels: Iterable[tuple[str, str]], field: str = "labels") -> None:
    """At most ``MAX_LABELS`` pairs, keys of ``LABEL_KEY_CHARACTERS`` (1..``MAX_LABEL_KEY``),
    values of at most ``MAX_LABEL_VALUE`` characters without NUL."""
    pairs = list(labels)
    if len(pairs) > MAX_LABELS:
        raise InvalidArgument(field, f"holds {len(pairs)} labels; the limit is {MAX_LABELS}")
    for key, value in pairs:
        if not 1 <= len(key) <= MAX_LABEL_KEY or _LABEL_KEY.fullmatch(key) is None:
            raise InvalidArgument(
                field,
                f"key {shown(key[:MAX_LABEL_KEY])} must be 1..{MAX_LABEL_KEY} characters of "
                f"{LABEL_KEY_CHARACTERS}",
            )
        if len(value) > MAX_LABEL_VALUE:
            raise InvalidArgument(
                field,
                f"value of {key!r} is {len(value)} characters long; the limit is "
                f"{MAX_LABEL_VALUE}",
            )
        if "\x00" in value:
            raise InvalidArgument(field, f"value of {key!r} must not contain NUL characters")


def check_content_type(value: str, field: str = "content_type") -> str:
    """A MIME type such as ``application/json``: at most ``MAX_CONTENT_TYPE`` characters of
    ``type/subtype`` with optional ``; name=value`` parameters."""
    if len(value) > MAX_CONTENT_TYPE:
        raise InvalidArgument(
            field, f"is {len(value)} characters long; the limit is {MAX_CONTENT_TYPE}"
        )
    if _CONTENT_TYPE.fullmatch(value) is None:
        raise InvalidArgument(
            field, f"{shown(value)} is not a MIME type like application/json (type/subtype)"
        )
    return value


def check_text(field: str, value: str, limit: int) -> str:
    """A free string field: at most ``limit`` characters and no NUL."""
    if len(value) > limit:
        raise InvalidArgument(field, f"is {len(value)} characters long; the limit is {limit}")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    return value


def check_count(field: str, count: int, limit: int) -> int:
    """The length of a repeated field: checked before any of its entries is looked at."""
    if count > limit:
        raise InvalidArgument(field, f"holds {count} entries; the limit is {limit} per call")
    return count


def task_bytes(task: Task) -> int:
    """What ``task`` costs in an answer, counted as the store's ``task_bytes`` statement
    fragment counts it (bytes of its variable-length columns, NULL as 0), so a stream's and
    a statement's byte budgets agree; ``TASK_FIXED_BYTES`` added."""
    return (
        len(task.payload)
        + len(task.namespace.encode())
        + len(task.queue.encode())
        + len((task.last_error or "").encode())
        + len((task.idempotency_key or "").encode())
        + len((task.worker_id or "").encode())
        + len((task.fired_by or "").encode())
        + (0 if task.content_type == OCTET_STREAM else len(task.content_type.encode()))
        + tracecontext.stored_bytes(task.trace_context)
        + len((task.concurrency_key or "").encode())
        + len((task.unique_key or "").encode())
        + len((task.debounce_key or "").encode())
        + tracecontext.stored_bytes(task.labels)
        + TASK_FIXED_BYTES
    )


def full_answer_bytes(request_bytes: int, tasks: int) -> int:
    """At most what a full ``SubmitBatch`` answer costs, from its request's size: each task
    echoed with its id, times and numbers (``TASK_FIXED_BYTES``) added to its spec."""
    return request_bytes + tasks * TASK_FIXED_BYTES


def check_full_answer(request_bytes: int, tasks: int) -> None:
    """Refuse, before anything is written, a batch whose full answer would pass the budget
    (the caller could not read it, though every task was accepted)."""
    size = full_answer_bytes(request_bytes, tasks)
    if size > MAX_ANSWER_BYTES:
        raise InvalidArgument(
            "tasks",
            f"a full answer to these {tasks} tasks would be up to {size} bytes; the limit is "
            f"{MAX_ANSWER_BYTES} bytes per answer: set ids_only, or send fewer tasks per batch",
        )


def check_range(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be between {low} and {high}, got {value}")
    return value


def check_rate(field: str, value: float, high: float) -> float:
    """A finite, non-negative number up to ``high`` (NaN and infinities are refused)."""
    if not math.isfinite(value):
        raise InvalidArgument(field, f"must be a finite number, got {value}")
    if not 0 <= value <= high:
        raise InvalidArgument(field, f"must be between 0 and {high:g}, got {value:g}")
    return value


def failure_message(text: str) -> str:
    """A handler's failure message as the store keeps it: NUL replaced with U+FFFD (text
    cannot hold NUL) and cut at ``MAX_ERROR_MESSAGE`` characters. Never refused: the
    failure must be recorded, or the task stays RUNNING until its lease expires."""
    return text[:MAX_ERROR_MESSAGE].replace("\x00", "\ufffd")


def human(d: timedelta) -> str:
    """A bound as people write it: ``366 days``, ``24 hours``, ``1 s``, ``0.5 s``."""
    secs = d.total_seconds()
    if secs and secs % 86400 == 0:
        return f"{secs // 86400:.0f} days"
    if secs and secs % 3600 == 0:
        return f"{secs // 3600:.0f} hours"
    return f"{secs:g} s"

#: Characters of a shard DSN that ``AddShard`` takes (a libpq URL with its options fits).
MAX_DSN_CHARS = 4096
#: Seconds ``AddShard`` gives the new shard to connect and migrate before it answers.
ADD_SHARD_TIMEOUT = 30.0
#: Moves not yet finished that a cluster keeps at once (a rebalance over many shards fits).
MAX_OPEN_MOVES = 64
#: Finished move records kept in etcd for status, the oldest dropped first.
KEPT_FINISHED_MOVES = 16
