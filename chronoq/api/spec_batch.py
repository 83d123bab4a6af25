"""The specs of one submitted batch, converted and checked in one pass.

``Limits.check(spec_from_pb(...))`` per spec is the definition, and costs ~9 µs a task, most
of it spent again on values every task of a batch shares: the namespace and queue, the
content type, the retry policy and lease, a delay. A ``SpecChecker`` sends each spec whose
shared values it has not seen yet through that definition, remembers the values it passed,
and builds the next specs holding only values already passed, checking what is the task's
own (its time, payload, key, priority) inline. A spec the quick path does not take whole goes
through the definition, so a refusal names the same field with the same words as before.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chronoq.api.convert import spec_from_pb
from chronoq.api.v1 import tasks_pb2
from chronoq.limits import (
    EARLIEST,
    MAX_IDEMPOTENCY_KEY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    Limits,
)
from chronoq.models import MisfirePolicy, TaskDefaults, TaskSpec

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: protobuf's bounds of a Timestamp (0001-01-01 to 9999-12-31), in seconds since the epoch.
_SECONDS = (-62_135_596_800, 253_402_300_799)
_NANOS = 1_000_000_000
_POLICIES = {
    tasks_pb2.MISFIRE_POLICY_UNSPECIFIED: MisfirePolicy.FIRE_LATE,
    tasks_pb2.MISFIRE_POLICY_FIRE_LATE: MisfirePolicy.FIRE_LATE,
    tasks_pb2.MISFIRE_POLICY_SKIP: MisfirePolicy.SKIP,
}

#: A spec's execution fields as they arrived: its retry message (serialized), lease timeout
#: and misfire grace (seconds, nanos), each None when unset.
_ExecutionKey = tuple[bytes | None, tuple[int, int] | None, tuple[int, int] | None]
#: What a spec's execution fields became: max attempts, backoff initial and max, lease
#: timeout, misfire grace.
_Execution = tuple[int, timedelta, timedelta, timedelta, timedelta]


class SpecChecker:
    """``checker(pb)`` is ``limits.check(spec_from_pb(pb, now, defaults, limits), now)``.

    What it remembers is bounded by the batch: one entry per distinct value the batch holds,
    and a checker lives for one request."""

    def __init__(self, now: datetime, defaults: TaskDefaults, limits: Limits) -> None:
        self._now = now
        self._defaults = defaults
        self._limits = limits
        try:
            self._latest: datetime | None = now + limits.horizon
        except OverflowError:  # a clock at the end of time: every spec the long way
            self._latest = None
        self._namespaces: dict[str, str] = {}  # as sent (empty: default) -> as stored
        self._queues: set[str] = set()
        self._content_types: dict[str, str] = {}  # as sent -> as stored
        self._delays: dict[tuple[int, int], timedelta] = {}
        self._execution: dict[_ExecutionKey, _Execution] = {}

    @property
    def horizon_end(self) -> datetime | None:
        """The latest run_at accepted (None: the clock is at the end of time)."""
        return self._latest

    @property
    def max_payload_bytes(self) -> int:
        return self._limits.max_payload_bytes

    def _checked(self, pb: tasks_pb2.TaskSpec, execution: _ExecutionKey) -> TaskSpec:
        """The definition; the shared values of a spec it passes are remembered."""
        now = self._now
        spec = self._limits.check(spec_from_pb(pb, now, self._defaults, self._limits), now)
        self._namespaces[pb.namespace] = spec.namespace
        self._queues.add(spec.queue)
        self._content_types[pb.content_type] = spec.content_type
        if pb.WhichOneof("when") == "delay":
            self._delays[(pb.delay.seconds, pb.delay.nanos)] = spec.run_at - now
        self._execution[execution] = (
            spec.max_attempts,
            spec.backoff_initial,
            spec.backoff_max,
            spec.lease_timeout,
            spec.misfire_grace,
        )
        return spec

    def __call__(self, pb: tasks_pb2.TaskSpec) -> TaskSpec:
        execution: _ExecutionKey = (
            pb.retry.SerializeToString(deterministic=True) if pb.HasField("retry") else None,
            (pb.lease_timeout.seconds, pb.lease_timeout.nanos)
            if pb.HasField("lease_timeout")
            else None,
            (pb.misfire_grace.seconds, pb.misfire_grace.nanos)
            if pb.HasField("misfire_grace")
            else None,
        )
        fields = self._quick(pb, execution)
        return self._checked(pb, execution) if fields is None else TaskSpec.of_fields(fields)

    def _quick(self, pb: tasks_pb2.TaskSpec, execution: _ExecutionKey) -> dict[str, Any] | None:
        """The spec's fields when every shared value was passed before and its own values
        are within bounds; None sends it the long way (which refuses it, or remembers)."""
        latest = self._latest
        has = pb.HasField
        shared = self._execution.get(execution)
        namespace = self._namespaces.get(pb.namespace)
        queue = pb.queue
        content_type = self._content_types.get(pb.content_type)
        policy = _POLICIES.get(pb.misfire_policy)
        if (
            latest is None
            or shared is None
            or namespace is None
            or queue not in self._queues
            or content_type is None
            or policy is None
            or pb.trace_context  # rare: the long way, every time
            # queue controls: the long way too (inline, a call costs more than the reads)
            or pb.concurrency_key
            or pb.unique_key
            or pb.debounce_key
            or pb.labels
            or has("unique_for")
            or has("debounce")
            or has("debounce_max")
        ):
            return None
        which = pb.WhichOneof("when")
        if which == "run_at":
            ts = pb.run_at
            seconds, nanos = ts.seconds, ts.nanos
            if not (_SECONDS[0] <= seconds <= _SECONDS[1] and 0 <= nanos < _NANOS):
                return None
            run_at = _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
        elif which == "delay":
            delay = self._delays.get((pb.delay.seconds, pb.delay.nanos))
            if delay is None:
                return None
            run_at = self._now + delay
        else:
            return None
        payload = pb.payload
        key = pb.idempotency_key
        priority = pb.priority
        if (
            run_at < EARLIEST
            or run_at > latest
            or len(payload) > self._limits.max_payload_bytes
            or len(key) > MAX_IDEMPOTENCY_KEY
            or "\x00" in key
            or not MIN_PRIORITY <= priority <= MAX_PRIORITY
        ):
            return None
        max_attempts, backoff_initial, backoff_max, lease_timeout, misfire_grace = shared
        return {
            "queue": queue,
            "run_at": run_at,
            "namespace": namespace,
            "payload": payload,
            "idempotency_key": key or None,
            "max_attempts": max_attempts,
            "backoff_initial": backoff_initial,
            "backoff_max": backoff_max,
            "lease_timeout": lease_timeout,
            "priority": priority,
            "misfire_policy": policy,
            "misfire_grace": misfire_grace,
            "content_type": content_type,
            "trace_context": (),
            # The queue controls are left out: a spec here has none, and the class holds
            # their defaults (None, ()), which an instance without its own value reads.
        }
