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
    timed = first.run_at is not None
    if timed and first.delay is not None:
        return None  # refused whole, with its reason
    run_ats = [t.run_at for t in tasks]
    if timed:
        try:
            run_at_us = [(r - _EPOCH) // _US for r in run_ats]  # type: ignore[operator]
        except TypeError:  # a naive time (UTC, as a whole spec reads it) or a missing one
            if any(r is None for r in run_ats):
                return None
            run_at_us = [(_aware(r) - _EPOCH) // _US for r in run_ats]  # type: ignore[arg-type]
    elif any(r is not None for r in run_ats):
        return None
    payloads: list[bytes] = []
    content_type = None
    for t in tasks:  # each as a whole spec encodes it (all share first.content_type)
        payload, kind = encode_payload(t.payload, t.content_type)
        if kind != (content_type or kind):
            return None  # bytes beside JSON values: two content types
        content_type = kind
        payloads.append(payload)
    minted = iter(new_keys(sum(1 for t in tasks if not t.idempotency_key)))
    keys = [t.idempotency_key or next(minted) for t in tasks]
    ours = [not t.idempotency_key for t in tasks]
    spec = dataclasses.replace(first, run_at=None, payload=b"", idempotency_key=None).to_pb(
        namespace
    )
    if timed:
        spec.ClearField("when")
    spec.content_type = "" if content_type in (None, OCTET_STREAM) else content_type
    request = tasks_pb2.SubmitBatchRequest(
        ids_only=True,
        shared=spec,
        count=len(tasks),
        run_at_us=run_at_us if timed else (),
        payloads=payloads,
        idempotency_keys=keys,
    )
    return request, ours


def _aware(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when
