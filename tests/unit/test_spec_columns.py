"""A columnar batch checks as the same tasks sent whole: the same specs, or the same refusal
of the same task; and the SDK's columnar request reads back as the tasks it was given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoq.api import spec_columns
from chronoq.api.spec_batch import SpecChecker
from chronoq.api.v1 import tasks_pb2
from chronoq.client.client import Client
from chronoq.client.columns import columnar
from chronoq.client.values import NewTask
from chronoq.errors import InvalidArgument
from chronoq.models import TaskSpec
from tests.unit.test_spec_batch import DEFAULTS, KEYS, LIMITS, NOW, specs

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NOW_US = (NOW - EPOCH) // timedelta(microseconds=1)
HORIZON_US = LIMITS.horizon // timedelta(microseconds=1)
#: run_at values around every bound the checks have, in microseconds since the epoch.
RUN_ATS = [
    NOW_US,
    NOW_US + 1,
    NOW_US + 3_600_000_000,
    0,
    -1,
    NOW_US + HORIZON_US,
    NOW_US + HORIZON_US + 1,
    -62_135_596_800_000_001,
    2**62,
]


def whole(request: tasks_pb2.SubmitBatchRequest) -> list[TaskSpec] | str:
    """The definition: each task sent whole, checked in turn as the node checks a batch (its
    first refusal, named ``tasks[i].field``, refuses the request)."""
    check = SpecChecker(NOW, DEFAULTS, LIMITS)
    out = []
    for i in range(request.count):
        try:
            out.append(check(spec_columns.whole_spec(request, i)))
        except InvalidArgument as exc:
            if request.count == 1:
                return exc.message
            return f"tasks[{i}].{exc.field}: {exc.message.split(': ', 1)[1]}"
    return out


def columns(request: tasks_pb2.SubmitBatchRequest) -> list[TaskSpec] | str:
    try:
        count = spec_columns.check_shape(request, 100)
        check = SpecChecker(NOW, DEFAULTS, LIMITS)
        return [s for part in spec_columns.column_specs(request, check, count) for s in part]
    except InvalidArgument as exc:
        return exc.message


@st.composite
def requests(draw: st.DrawFn) -> tasks_pb2.SubmitBatchRequest:
    """A columnar request whose shared spec and columns hold good and bad values."""
    shared = tasks_pb2.TaskSpec()
    shared.CopyFrom(draw(specs(valid=draw(st.booleans()))))
    count = draw(st.integers(1, 12))
    request = tasks_pb2.SubmitBatchRequest(ids_only=True, count=count)
    good = draw(st.booleans())  # mostly good columns, so the copies are taken
    if draw(st.booleans()):
        shared.ClearField("when")
        values = RUN_ATS[:3] if good else RUN_ATS
        request.run_at_us.extend(
            draw(st.lists(st.sampled_from(values), min_size=count, max_size=count))
        )
    if draw(st.booleans()):
        shared.payload = b""
        sizes = [0, 10, 64] if good else [0, 10, 64, 65]
        request.payloads.extend(
            b"p" * n for n in draw(st.lists(st.sampled_from(sizes), min_size=count, max_size=count))
        )
    if draw(st.booleans()):
        shared.idempotency_key = ""
        keys = KEYS[:3] if good else KEYS
        request.idempotency_keys.extend(
            draw(st.lists(st.sampled_from(keys), min_size=count, max_size=count))
        )
    request.shared.CopyFrom(shared)
    return request


@settings(database=None, max_examples=300)
@given(request=requests())
def test_a_columnar_batch_checks_as_its_tasks_sent_whole(
    request: tasks_pb2.SubmitBatchRequest,
) -> None:
    assert columns(request) == whole(request)


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda r: r.ClearField("shared"), "shared: is required"),
        (lambda r: setattr(r, "count", 0), "count: must be at least 1"),
        (lambda r: setattr(r, "count", 101), "count: is 101 tasks; the limit is 100"),
        (lambda r: r.run_at_us.append(NOW_US), "run_at_us: holds 3 values for 2 tasks"),
        (lambda r: r.payloads.append(b"x"), "payloads: holds 1 values for 2 tasks"),
        (lambda r: r.idempotency_keys.pop(), "idempotency_keys: holds 1 values for 2 tasks"),
        (lambda r: r.tasks.add(queue="q"), "tasks: must be empty in the columnar form"),
        (lambda r: setattr(r, "ids_only", False), "ids_only: must be set"),
        (lambda r: r.shared.delay.FromSeconds(5), "shared.run_at: must be unset"),
        (lambda r: setattr(r.shared, "idempotency_key", "k"), "shared.idempotency_key: must"),
    ],
)
def test_a_request_of_the_wrong_shape_is_refused_by_name(change: object, refusal: str) -> None:
    request = tasks_pb2.SubmitBatchRequest(
        ids_only=True,
        shared=tasks_pb2.TaskSpec(queue="q"),
        count=2,
        run_at_us=[NOW_US, NOW_US],
        idempotency_keys=["a", "b"],
    )
    change(request)  # type: ignore[operator]
    assert str(columns(request)).startswith(refusal)


def task_lists() -> st.SearchStrategy[list[NewTask]]:
    when = NOW + timedelta(minutes=5)
    one = st.builds(
        NewTask,
        queue=st.sampled_from(["q", "mail"]),
        run_at=st.sampled_from([when, when + timedelta(seconds=1), when.replace(tzinfo=None)]),
        payload=st.sampled_from([b"", b"x", {"a": 1}]),
        idempotency_key=st.sampled_from([None, "k1", "k2"]),
        priority=st.sampled_from([0, 0, 3]),
        concurrency_key=st.sampled_from([None, None, "c"]),
    )
    return st.lists(one, min_size=1, max_size=8)


@settings(database=None, max_examples=200)
@given(tasks=task_lists())
def test_the_sdks_columnar_request_reads_as_its_tasks(tasks: list[NewTask]) -> None:
    """Sent in columns when they share all but run_at, payload and key, else whole; read back
    on the node, each is the spec its whole form gives, with the key the columns carry."""
    made = columnar(tasks, "default")
    shared = {(t.queue, t.priority, t.concurrency_key, t.content_type) for t in tasks}
    kinds = {isinstance(t.payload, bytes) for t in tasks}
    if len(shared) > 1 or len(kinds) > 1:
        assert made is None
        return
    assert made is not None
    request, ours = made
    assert ours == [t.idempotency_key is None for t in tasks]
    client = object.__new__(Client)
    client.namespace = "default"
    check = SpecChecker(NOW, DEFAULTS, LIMITS)
    expected = []
    for task, key in zip(tasks, request.idempotency_keys, strict=True):
        spec = task.to_pb("default", idempotency_key=key)
        expected.append(check(spec))
    assert columns(request) == expected


def test_a_large_columnar_batch_comes_in_parts_between_which_the_node_yields() -> None:
    n = 2 * spec_columns.SLICE + 201
    request = tasks_pb2.SubmitBatchRequest(
        ids_only=True,
        shared=tasks_pb2.TaskSpec(queue="q"),
        count=n,
        run_at_us=[NOW_US + i for i in range(n)],
        idempotency_keys=[f"k{i}" for i in range(n)],
    )
    parts = list(spec_columns.column_specs(request, SpecChecker(NOW, DEFAULTS, LIMITS), n))
    assert [len(p) for p in parts] == [1, spec_columns.SLICE, spec_columns.SLICE, 200]
    assert [s for p in parts for s in p] == whole(request)
