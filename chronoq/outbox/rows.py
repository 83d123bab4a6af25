"""An outbox row: a task to submit, checked and encoded the way ``Client.submit`` would send
it, so a row the application commits is one the node accepts (bar limits a node sets lower
than the defaults: the relay moves such a row aside). Pure: no database, no network.

The spec is stored as the serialized ``chronoq.v1.TaskSpec`` rather than as columns: it is
exactly what the relay sends, every field ``submit`` takes (queue controls, labels, trace
context) travels without a column or a migration of the application's table when chronoq
adds one, and the relay never re-derives a task from columns it might read differently.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from google.protobuf.message import DecodeError

from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2
from chronoq.client.values import NewTask
from chronoq.errors import ChronoqError, InvalidArgument
from chronoq.ids import time_ordered_ids
from chronoq.limits import Limits, check_name
from chronoq.models import DEFAULT_NAMESPACE, TASK_DEFAULTS

_LIMITS = Limits()


@dataclass(frozen=True)
class OutboxRow:
    id: uuid.UUID
    namespace: str
    queue: str
    spec: bytes  # a serialized TaskSpec


def new_row(
    queue: str,
    fields: dict[str, Any],
    *,
    namespace: str = DEFAULT_NAMESPACE,
    now: datetime | None = None,
) -> OutboxRow:
    """The row of ``queue``'s task with ``submit``'s ``fields``; ``InvalidArgument`` (naming
    the field) for anything ``submit`` would refuse. A ``delay`` counts from now, the
    enqueue, not from when the relay gets to it: it becomes a ``run_at``. The row's id is the
    task's idempotency key unless ``fields`` give one."""
    when = now or datetime.now(UTC)
    check_name("namespace", namespace)
    if "namespace" in fields:
        raise InvalidArgument("namespace", "is an argument of enqueue, not a task field")
    try:
        task = NewTask(queue=queue, **fields)
    except TypeError as exc:  # an unknown field
        raise InvalidArgument("fields", f"{exc}; see chronoq.client.NewTask") from None
    if task.delay is not None:
        if task.run_at is not None:
            raise InvalidArgument("delay", "set run_at or delay, not both")
        task = replace(task, delay=None, run_at=when + _LIMITS.check_delay("delay", task.delay))
    (row_id,) = time_ordered_ids(1, time.time_ns() // 1_000_000)
    try:
        pb = task.to_pb(namespace, idempotency_key=str(row_id))
        # What the node runs on every spec of a submit, with the default limits.
        _LIMITS.check(convert.spec_from_pb(pb, when, TASK_DEFAULTS, _LIMITS), when)
    except InvalidArgument:
        raise
    except ChronoqError as exc:  # the SDK's own refusals (BadRequest, PayloadNotJSON)
        raise InvalidArgument("task", exc.message) from exc
    return OutboxRow(row_id, namespace, queue, pb.SerializeToString())


def spec_of(raw: bytes) -> tasks_pb2.TaskSpec:
    """A row's spec as the relay sends it; ``InvalidArgument`` when the bytes are not one."""
    pb = tasks_pb2.TaskSpec()
    try:
        pb.ParseFromString(raw)
    except DecodeError as exc:  # a row someone wrote by hand
        raise InvalidArgument("spec", f"is not a serialized TaskSpec ({exc})") from None
    return pb
