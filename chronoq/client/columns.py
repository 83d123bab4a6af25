"""A bulk submit in the columnar form of ``SubmitBatch``: what its tasks share once, each
task's own run_at, payload and idempotency key in columns (``chronoq.api.spec_columns`` reads
it on the node).

A bulk load's tasks mostly differ in nothing else, and writing each as a whole wire spec cost
the client more than the node spent inserting it. A batch whose tasks differ in anything
more, or carry a unique or debounce key (whose answer may be another caller's task), goes
whole, as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from operator import attrgetter

from chronoq.api.v1 import tasks_pb2
from chronoq.client.payload import encode as encode_payload
from chronoq.client.values import NewTask, new_keys
from chronoq.models import OCTET_STREAM

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: A task's fields that go in columns; every other field must be the batch's first task's.
_OWN = frozenset({"run_at", "payload", "idempotency_key"})
_shared_of = attrgetter(*(f.name for f in dataclasses.fields(NewTask) if f.name not in _OWN))


def columnar(
    tasks: Sequence[NewTask], namespace: str
) -> tuple[tasks_pb2.SubmitBatchRequest, list[bool]] | None:
    """``tasks`` as one columnar ``SubmitBatch`` request with ids only, and per task whether
    any answer to it is a task this call made (its key was minted here); None when they do
    not fit the form (send them whole)."""
    if not tasks:
        return None
    first = tasks[0]
    if first.unique_key or first.debounce_key:
        return None
    shared = _shared_of(first)
    if any(_shared_of(t) != shared for t in tasks):
        return None
    times = _times(tasks)
    bodies = _payloads(tasks)
    if times is None or bodies is None:
        return None
    run_at_us, timed = times
    payloads, content_type = bodies
    minted = iter(new_keys(sum(1 for t in tasks if not t.idempotency_key)))
    keys = [t.idempotency_key or next(minted) for t in tasks]
    ours = [not t.idempotency_key for t in tasks]
    spec = dataclasses.replace(first, run_at=None, payload=b"", idempotency_key=None).to_pb(
        namespace
    )
    if timed:
        spec.ClearField("when")
    spec.content_type = "" if content_type == OCTET_STREAM else content_type
    request = tasks_pb2.SubmitBatchRequest(
        ids_only=True,
        shared=spec,
        count=len(tasks),
        run_at_us=run_at_us,
        payloads=payloads,
        idempotency_keys=keys,
    )
    return request, ours


def _times(tasks: Sequence[NewTask]) -> tuple[list[int], bool] | None:
    """The run_at column (microseconds since the epoch) and whether there is one (else
    every task has the first's delay, or none: due now); None when the tasks mix the two."""
    first = tasks[0]
    run_ats = [t.run_at for t in tasks]
    if first.run_at is None:
        return None if any(r is not None for r in run_ats) else ([], False)
    if first.delay is not None:
        return None  # refused whole, with its reason
    try:
        return [(r - _EPOCH) // _US for r in run_ats], True  # type: ignore[operator]
    except TypeError:  # a naive time (UTC, as a whole spec reads it) or a missing one
        if any(r is None for r in run_ats):
            return None
        return [(_aware(r) - _EPOCH) // _US for r in run_ats], True  # type: ignore[arg-type]


def _payloads(tasks: Sequence[NewTask]) -> tuple[list[bytes], str] | None:
    """Each task's payload as a whole spec encodes it, and their one content type; None when
    they have two (bytes beside JSON values)."""
    payloads = [t.payload for t in tasks]
    if tasks[0].content_type is None and all(type(p) is bytes for p in payloads):
        return payloads, OCTET_STREAM  # raw bytes, as they are (most bulk loads)
    content_type = ""
    for i, t in enumerate(tasks):
        payloads[i], kind = encode_payload(t.payload, t.content_type)
        if kind != (content_type or kind):
            return None
        content_type = kind
    return payloads, content_type


def _aware(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when
