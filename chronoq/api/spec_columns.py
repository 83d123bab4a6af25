"""The columnar form of a submitted batch: one shared spec and each task's own run_at,
payload and idempotency key in columns, turned into the same checked specs as the tasks sent
whole (``SpecChecker`` of each, with the same refusals).

Sent whole, every task of a bulk load repeats its namespace, queue, policy and content type,
and each is decoded and looked at again; here they are checked once, and what is the task's
own is checked column by column (lengths, bounds) before any spec is built. A column of a
value the quick checks do not pass sends its task the long way (the whole spec rebuilt and
checked by ``SpecChecker``), which refuses it with the words it would use for a whole task.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from chronoq.api.spec_batch import SpecChecker
from chronoq.api.v1 import tasks_pb2
from chronoq.errors import InvalidArgument
from chronoq.limits import EARLIEST, MAX_IDEMPOTENCY_KEY
from chronoq.models import TaskSpec

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: The columns of a request: each task's own run_at, payload and idempotency key.
COLUMNS = ("run_at_us", "payloads", "idempotency_keys")
#: Specs built between two looks at the event loop (about a millisecond).
SLICE = 500


def is_columnar(request: tasks_pb2.SubmitBatchRequest) -> bool:
    """Whether ``request`` uses the columnar form (a shared spec, or any column)."""
    return (
        request.HasField("shared")
        or request.count > 0
        or bool(request.run_at_us or request.payloads or request.idempotency_keys)
    )


def check_shape(request: tasks_pb2.SubmitBatchRequest, max_batch: int) -> int:
    """The number of tasks of a columnar ``request``, once its shape is sound: a shared spec
    without the fields of its columns, ``count`` within the batch limit, every column of
    ``count`` values or none, and no whole tasks beside them."""
    if request.tasks:
        raise InvalidArgument("tasks", "must be empty in the columnar form (shared and columns)")
    if not request.ids_only:
        raise InvalidArgument("ids_only", "must be set in the columnar form")
    if not request.HasField("shared"):
        raise InvalidArgument("shared", "is required in the columnar form")
    count = request.count
    if count < 1:
        raise InvalidArgument("count", "must be at least 1")
    if count > max_batch:
        raise InvalidArgument("count", f"is {count} tasks; the limit is {max_batch} per batch")
    for column in COLUMNS:
        values = len(getattr(request, column))
        if values not in (0, count):
            raise InvalidArgument(column, f"holds {values} values for {count} tasks")
    shared = request.shared
    if request.run_at_us and shared.WhichOneof("when") is not None:
        raise InvalidArgument("shared.run_at", "must be unset when run_at_us is given")
    if request.payloads and shared.payload:
        raise InvalidArgument("shared.payload", "must be empty when payloads are given")
    if request.idempotency_keys and shared.idempotency_key:
        raise InvalidArgument(
            "shared.idempotency_key", "must be empty when idempotency_keys are given"
        )
    return count


def whole_spec(request: tasks_pb2.SubmitBatchRequest, i: int) -> tasks_pb2.TaskSpec:
    """Task ``i`` of a columnar ``request`` as it would have been sent whole."""
    pb = tasks_pb2.TaskSpec()
    pb.CopyFrom(request.shared)
    if request.run_at_us:
        seconds, us = divmod(request.run_at_us[i], 1_000_000)
        pb.run_at.seconds, pb.run_at.nanos = seconds, us * 1000
    if request.payloads:
        pb.payload = request.payloads[i]
    if request.idempotency_keys:
        pb.idempotency_key = request.idempotency_keys[i]
    return pb


def _usable(checker: SpecChecker, first: TaskSpec) -> bool:
    """Whether the tasks after the first may be copies of it with their own columns: its
    queue controls (unique, debounce) derive nothing from run_at or the key."""
    return (
        first.unique_key is None and first.debounce_key is None and checker.horizon_end is not None
    )


def _checked_whole(checker: SpecChecker, request: tasks_pb2.SubmitBatchRequest, i: int) -> TaskSpec:
    """Task ``i`` the long way; a refusal names it as ``tasks[i]``."""
    try:
        return checker(whole_spec(request, i))
    except InvalidArgument as exc:
        if request.count == 1:
            raise
        problem = exc.message.split(": ", 1)[1]
        raise InvalidArgument(f"tasks[{i}].{exc.field}", problem) from None


def column_specs(
    request: tasks_pb2.SubmitBatchRequest, checker: SpecChecker, count: int
) -> Iterator[list[TaskSpec]]:
    """The checked specs of a columnar ``request`` of ``count`` tasks (``check_shape``), in
    order and in parts of at most ``SLICE`` (the caller yields to the event loop between
    them): the first the long way, the others copies of it with their own values once these
    pass the bounds the long way would check (else the long way, which refuses them)."""
    first = _checked_whole(checker, request, 0)
    yield [first]
    if count == 1 or not _usable(checker, first):
        for start in range(1, count, SLICE):
            yield [
                _checked_whole(checker, request, i) for i in range(start, min(count, start + SLICE))
            ]
        return
    latest = checker.horizon_end
    assert latest is not None
    low = (EARLIEST - _EPOCH) // _US
    high = (latest - _EPOCH) // _US
    max_payload = checker.max_payload_bytes
    # As lists: an index into a message's repeated field costs about a microsecond.
    run_ats: Sequence[int] = list(request.run_at_us)
    payloads: Sequence[bytes] = list(request.payloads)
    keys: Sequence[str] = list(request.idempotency_keys)
    # Every column's bounds at once (a pass in C each); a column that fails one is looked at
    # task by task, and the first task out of bounds is refused the long way.
    sound = (
        (not run_ats or (low <= min(run_ats) and max(run_ats) <= high))
        and (not payloads or max(map(len, payloads)) <= max_payload)
        and (not keys or (max(map(len, keys)) <= MAX_IDEMPOTENCY_KEY and not _has_nul(keys)))
    )
    if not sound:
        for i in range(count):
            if not _own_sound(request, i, low, high, max_payload):
                _checked_whole(checker, request, i)  # raises
        raise AssertionError("a column out of bounds, but no task of it")  # pragma: no cover
    base = dict(first.__dict__)
    for start in range(1, count, SLICE):
        end = min(count, start + SLICE)
        yield _copies(base, run_ats[start:end], payloads[start:end], keys[start:end], end - start)


def _copies(
    base: dict[str, Any],
    run_ats: Sequence[int],
    payloads: Sequence[bytes],
    keys: Sequence[str],
    count: int,
) -> list[TaskSpec]:
    """``count`` specs of the fields ``base`` with their own columns (an empty column: the
    base's value): a dict copy and three stores a task (a frozen dataclass would set each
    field through its ``__setattr__``)."""
    epoch, us = _EPOCH, timedelta
    own_run_ats = [epoch + us(microseconds=u) for u in run_ats] or [base["run_at"]] * count
    own_payloads = payloads or [base["payload"]] * count
    own_keys = [k or None for k in keys] or [base["idempotency_key"]] * count
    out = []
    new, put = object.__new__, object.__setattr__
    for run_at, payload, key in zip(own_run_ats, own_payloads, own_keys, strict=True):
        fields = base.copy()
        fields["run_at"] = run_at
        fields["payload"] = payload
        fields["idempotency_key"] = key
        spec = new(TaskSpec)
        put(spec, "__dict__", fields)
        out.append(spec)
    return out


def _has_nul(keys: Sequence[str]) -> bool:
    """Whether any key holds a NUL (one scan of them joined)."""
    return "\x00" in "".join(keys)


def _own_sound(
    request: tasks_pb2.SubmitBatchRequest, i: int, low: int, high: int, max_payload: int
) -> bool:
    """Whether task ``i``'s own columns pass the quick bounds."""
    if request.run_at_us and not low <= request.run_at_us[i] <= high:
        return False
    if request.payloads and len(request.payloads[i]) > max_payload:
        return False
    if request.idempotency_keys:
        key = request.idempotency_keys[i]
        if len(key) > MAX_IDEMPOTENCY_KEY or "\x00" in key:
            return False
    return True
