"""What the client's calls take and give: a task to submit, a submit's outcome, the cluster's
status. Plain values (``NewTask.to_pb`` writes a task as the wire wants it)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from chronoq import errors, tracing
from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2
from chronoq.client import controls
from chronoq.client.payload import Payload
from chronoq.client.payload import encode as encode_payload
from chronoq.models import OCTET_STREAM, TASK_DEFAULTS, MisfirePolicy, Task


@dataclass(frozen=True, kw_only=True)
class NewTask:
    """A task to submit; unset fields take the node's defaults.

    ``payload``: bytes are sent as they are (``content_type`` default
    ``application/octet-stream``); any other value is sent as JSON (``application/json``),
    and a value JSON cannot hold raises ``PayloadNotJSON`` before anything is sent."""

    queue: str
    run_at: datetime | None = None
    delay: timedelta | None = None
    payload: Payload = b""
    content_type: str | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None
    backoff_initial: timedelta | None = None
    backoff_max: timedelta | None = None
    lease_timeout: timedelta | None = None
    priority: int = TASK_DEFAULTS.priority
    misfire_policy: MisfirePolicy = TASK_DEFAULTS.misfire_policy
    misfire_grace: timedelta | None = None
    # Queue controls (chronoq.client.controls); unset: none.
    concurrency_key: str | None = None
    unique_key: str | None = None
    unique_for: timedelta | None = None  # None: unique while pending
    debounce_key: str | None = None
    debounce: timedelta | None = None
    debounce_max: timedelta | None = None  # None: 10 x debounce, at most 7 days
    labels: Mapping[str, str] | None = None

    def to_pb(self, namespace: str, *, idempotency_key: str = "") -> tasks_pb2.TaskSpec:
        """The task as the wire wants it; ``idempotency_key`` is used when it has none."""
        payload, content_type = encode_payload(self.payload, self.content_type)
        if self.run_at is not None and self.delay is not None:
            raise errors.BadRequest("set run_at or delay, not both")
        # run_at given to the constructor: a third cheaper than copied in after it (a bulk
        # submit writes thousands of specs a call).
        pb = tasks_pb2.TaskSpec(
            namespace=namespace,
            queue=self.queue,
            payload=payload,
            content_type="" if content_type == OCTET_STREAM else content_type,
            idempotency_key=self.idempotency_key or idempotency_key,
            priority=self.priority,
            misfire_policy=convert.state_policy_to_pb(self.misfire_policy),
            run_at=convert.to_timestamp(self.run_at),
        )
        if self.run_at is None:
            pb.delay.FromTimedelta(self.delay if self.delay is not None else timedelta(0))
        if self.max_attempts is not None:
            if self.max_attempts < 0:
                raise errors.BadRequest("max_attempts: must be >= 1")
            pb.retry.max_attempts = self.max_attempts
        if self.backoff_initial is not None:
            pb.retry.backoff_initial.FromTimedelta(self.backoff_initial)
        if self.backoff_max is not None:
            pb.retry.backoff_max.FromTimedelta(self.backoff_max)
        if self.lease_timeout is not None:
            pb.lease_timeout.FromTimedelta(self.lease_timeout)
        if self.misfire_grace is not None:
            pb.misfire_grace.FromTimedelta(self.misfire_grace)
        if controls.has_controls(self):
            controls.write(pb, self)
        tracing.inject(pb.trace_context)  # no-op unless tracing is on
        return pb


def new_keys(count: int) -> list[str]:
    """``count`` fresh idempotency keys: time-ordered (version 7) UUIDs in their text form,
    written as text from one read of the system's randomness: the stamp's hex is the same for
    every key of a call, and each key takes 20 hex digits of its own (a ``uuid.UUID`` per key
    cost more than the rest of a task's encoding; bytes per key, then hex, half as much)."""
    if count <= 0:
        return []
    stamp = f"{(time.time_ns() // 1_000_000) & _STAMP:012x}"
    head = f"{stamp[:8]}-{stamp[8:]}-7"
    digits = os.urandom(10 * count).hex()
    variant = _VARIANT_DIGIT
    return [
        f"{head}{digits[i + 1 : i + 4]}-{variant[digits[i + 4]]}{digits[i + 5 : i + 8]}-"
        f"{digits[i + 8 : i + 20]}"
        for i in range(0, 20 * count, 20)
    ]


#: 48 bits of milliseconds, the stamp of a version 7 UUID.
_STAMP = (1 << 48) - 1
#: A random hex digit as the first digit of a UUID's variant field (0b10xx: 8, 9, a or b).
_VARIANT_DIGIT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


@dataclass(frozen=True)
class Submitted:
    task: Task
    created: bool  # False: an earlier submit with the same idempotency key won


@dataclass(frozen=True)
class BucketCount:
    bucket: int
    starts_at: datetime
    pending: int


@dataclass(frozen=True)
class MemberStatus:
    node_id: str
    address: str
    owned_partitions: int
    lateness_p50_ms: float
    lateness_p99_ms: float
    fired_total: int


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    owner: str
    fencing_token: int
    watermark_bucket: int
    shard: str = ""  # the store shard holding it


@dataclass(frozen=True)
class ShardStatus:
    name: str
    dsn: str  # password masked
    health: str  # "ok", "unreachable", "unknown"
    partitions: str  # the partitions held, as a list: "0-63,128"
    partition_count: int
    pending: int  # due in the counted buckets


@dataclass(frozen=True)
class MoveStatus:
    """One online move of partitions between store shards."""

    id: str  # "" in a dry run
    partitions: str  # as a list: "0-63"
    source: str
    target: str
    phase: str  # requested, prepare, copy, catch_up, cut_over, committed, clean_up, done,
    # rolling_back, rolled_back
    rows_copied: int = 0
    rounds: int = 0
    next_version: int = 0
    driver: str = ""
    error: str = ""  # why it was rolled back


@dataclass(frozen=True)
class AddedShard:
    shard: str
    dsn: str  # password masked
    map_version: int


@dataclass(frozen=True)
class ShardMapStatus:
    version: int
    shards: list[ShardStatus] = field(default_factory=list)
    moves_in_progress: int = 0
    error: str = ""  # why the map in etcd was last refused
    moves: list[MoveStatus] = field(default_factory=list)  # open and recently finished
    moves_error: str = ""  # why the move records could not be read


@dataclass(frozen=True)
class ClusterStatus:
    cluster: str
    node_id: str
    now: datetime
    partitions: int
    bucket_seconds: int
    members: list[MemberStatus] = field(default_factory=list)
    ownership: list[PartitionStatus] = field(default_factory=list)
    buckets: list[BucketCount] = field(default_factory=list)
    firing_partitions: list[int] = field(default_factory=list)  # what this node fires now
    shard_map: ShardMapStatus | None = None
