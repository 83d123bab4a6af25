"""A batch's specs checked in one pass are the specs, and the refusals, of one spec at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from chronoq.api import convert
from chronoq.api.spec_batch import SpecChecker
from chronoq.api.v1 import tasks_pb2
from chronoq.errors import InvalidArgument
from chronoq.limits import Limits
from chronoq.models import TaskDefaults, TaskSpec

NOW = datetime(2030, 1, 1, tzinfo=UTC)
DEFAULTS = TaskDefaults()
LIMITS = Limits(max_payload_bytes=64)

NAMES = ["", "default", "q", "mail", "a" * 200, "bad name", "x\x00"]
TYPES = ["", "application/json", "text/plain; charset=utf-8", "nope", "a/b\x00"]
KEYS = ["", "k1", "k2", "k" * 513, "nul\x00"]
SECONDS = [0, 1, 90, int(NOW.timestamp()), -5, int(NOW.timestamp()) + 400 * 86_400,
           -62_135_596_801, 253_402_300_800]
NANOS = [0, 1000, 999_999_999, -1, 1_000_000_000]


def pick(draw: st.DrawFn, values: list[object], good: int | None) -> object:
    """One of ``values``; only of the first ``good`` ones when drawing a valid spec."""
    return draw(st.sampled_from(values[:good] if good else values))


@st.composite
def specs(draw: st.DrawFn, valid: bool = False) -> tasks_pb2.TaskSpec:
    """A spec; with ``valid``, one that passes (values from the front of each list)."""
    v = 2 if valid else None
    pb = tasks_pb2.TaskSpec(
        namespace=pick(draw, NAMES, 4 if valid else None),  # type: ignore[arg-type]
        queue=pick(draw, NAMES[1:], 3 if valid else None),  # type: ignore[arg-type]
        payload=b"p" * pick(draw, [0, 64, 10, 65], 3 if valid else None),  # type: ignore[operator]
        content_type=pick(draw, TYPES, 3 if valid else None),  # type: ignore[arg-type]
        idempotency_key=pick(draw, KEYS, 3 if valid else None),  # type: ignore[arg-type]
        priority=pick(draw, [0, 5, -(2**31)], None),  # type: ignore[arg-type]
        misfire_policy=pick(draw, [0, 1, 2, 7], 3 if valid else None),  # type: ignore[arg-type]
    )
    when = pick(draw, ["run_at", "delay", "none"], v)
    if when == "run_at":
        pb.run_at.seconds = pick(draw, SECONDS, 4 if valid else None)  # type: ignore[assignment]
        pb.run_at.nanos = pick(draw, NANOS, 3 if valid else None)  # type: ignore[assignment]
    elif when == "delay":
        pb.delay.seconds = pick(draw, [0, 60, -1, 400 * 86_400], v)  # type: ignore[assignment]
    if draw(st.booleans()):
        pb.retry.max_attempts = pick(draw, [1, 5, 0, 5000], v)  # type: ignore[assignment]
    if draw(st.booleans()):
        pb.retry.backoff_initial.seconds = pick(draw, [1, 30, -1], v)  # type: ignore[assignment]
    if draw(st.booleans()):
        pb.lease_timeout.seconds = pick(draw, [10, 60, 0, 90_000], v)  # type: ignore[assignment]
    if draw(st.booleans()):
        pb.misfire_grace.seconds = pick(draw, [0, 10, -3], v)  # type: ignore[assignment]
    if not valid and draw(st.integers(0, 9)) == 0:
        pb.trace_context["traceparent"] = draw(st.sampled_from(["00-ok", "\x01"]))
    if draw(st.integers(0, 3)) == 0:  # queue controls, valid and not
        controls(draw, pb, valid)
    return pb


def controls(draw: st.DrawFn, pb: tasks_pb2.TaskSpec, valid: bool) -> None:
    """Some of a spec's queue controls; with ``valid``, a combination that passes."""
    good = 2 if valid else None
    pb.concurrency_key = pick(draw, ["", "c1", "k" * 129, "n\x00"], good)  # type: ignore[assignment]
    pb.unique_key = pick(draw, ["u1", "", "u" * 129], 1 if valid else None)  # type: ignore[assignment]
    if draw(st.booleans()):
        pb.unique_for.seconds = pick(draw, [60, 86_400, 0, -1, 31 * 86_400], good)  # type: ignore[assignment]
    if valid or draw(st.booleans()):
        pb.debounce_key = pick(draw, ["d1", "", "d" * 129], 1 if valid else None)  # type: ignore[assignment]
        pb.debounce.seconds = pick(draw, [5, 60, 0, 2 * 86_400], good)  # type: ignore[assignment]
        if draw(st.booleans()):
            pb.debounce_max.seconds = pick(draw, [600, 3600, 1, 8 * 86_400], good)  # type: ignore[assignment]
    if draw(st.booleans()):
        label = pick(draw, ["team", "a/b.c", "bad key", ""], good)
        pb.labels[label] = pick(draw, ["v", "", "x" * 257], good)  # type: ignore[index]


def one_at_a_time(pb: tasks_pb2.TaskSpec) -> TaskSpec | str:
    try:
        return LIMITS.check(convert.spec_from_pb(pb, NOW, DEFAULTS, LIMITS), NOW)
    except InvalidArgument as exc:
        return exc.message


def batched(check: SpecChecker, pb: tasks_pb2.TaskSpec) -> TaskSpec | str:
    try:
        return check(pb)
    except InvalidArgument as exc:
        return exc.message


@st.composite
def batches(draw: st.DrawFn) -> list[tasks_pb2.TaskSpec]:
    """Specs that share most of their values, as a batch's do: each is one of a few drawn
    specs with one field of another drawn spec, so the quick path meets every bad value."""
    bases = draw(st.lists(specs(valid=True), min_size=1, max_size=3))
    out = []
    for _ in range(draw(st.integers(1, 16))):
        pb = tasks_pb2.TaskSpec()
        pb.CopyFrom(draw(st.sampled_from(bases)))
        other = draw(specs())
        field = draw(st.sampled_from([
            "namespace", "queue", "payload", "content_type", "idempotency_key", "priority",
            "misfire_policy", "run_at", "delay", "retry", "lease_timeout", "misfire_grace",
            "concurrency_key", "unique_key", "unique_for", "debounce_key", "debounce",
            "debounce_max", "labels",
        ]))
        if field == "labels":
            pb.labels.clear()
            pb.labels.update(other.labels)
        elif field in (
            "run_at", "delay", "retry", "lease_timeout", "misfire_grace", "unique_for",
            "debounce", "debounce_max",
        ):
            if other.HasField(field):
                getattr(pb, field).CopyFrom(getattr(other, field))
            else:
                pb.ClearField(field)
        else:
            setattr(pb, field, getattr(other, field))
        out.append(pb)
    return out


@settings(database=None, max_examples=200)
@given(batch=batches())
def test_a_batch_checks_each_spec_as_one_spec_alone(batch: list[tasks_pb2.TaskSpec]) -> None:
    check = SpecChecker(NOW, DEFAULTS, LIMITS)
    for pb in batch:
        assert batched(check, pb) == one_at_a_time(pb)


def test_a_bad_value_after_good_ones_is_still_refused() -> None:
    """The values a batch remembers are what passed: the same field with another value is
    checked again, whatever came before."""
    check = SpecChecker(NOW, DEFAULTS, LIMITS)
    good = tasks_pb2.TaskSpec(queue="q", idempotency_key="k")
    good.delay.seconds = 5
    for _ in range(3):
        assert check(good).queue == "q"
    for field, bad in [
        ("queue", tasks_pb2.TaskSpec(queue="q q")),
        ("idempotency_key", tasks_pb2.TaskSpec(queue="q", idempotency_key="k\x00")),
        ("payload", tasks_pb2.TaskSpec(queue="q", payload=b"x" * 65)),
        ("namespace", tasks_pb2.TaskSpec(queue="q", namespace="no/pe")),
        ("content_type", tasks_pb2.TaskSpec(queue="q", content_type="json")),
    ]:
        bad.delay.seconds = 5
        try:
            check(bad)
        except InvalidArgument as exc:
            assert exc.field == field
        else:
            raise AssertionError(f"{field} was not checked")
    late = tasks_pb2.TaskSpec(queue="q")
    late.run_at.seconds = int((NOW + LIMITS.horizon + timedelta(seconds=1)).timestamp())
    try:
        check(late)
    except InvalidArgument as exc:
        assert exc.field == "run_at"
    else:
        raise AssertionError("a time beyond the horizon passed")


def test_a_spec_of_fields_is_the_dataclass_spec() -> None:
    spec = TaskSpec(queue="q", run_at=NOW, idempotency_key="k", payload=b"x")
    again = TaskSpec.of_fields(dict(spec.__dict__))
    assert again == spec
    assert hash(again) == hash(spec)
