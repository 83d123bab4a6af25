"""A task's queue controls (concurrency, unique and debounce keys, their windows, labels):
bounded at the edge with a refusal naming the field, carried both ways over the wire, and
placing the task by the first key of concurrency, unique, debounce, idempotency."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.api import convert
from chronoq.api.spec_batch import SpecChecker
from chronoq.api.v1 import tasks_pb2
from chronoq.errors import InvalidArgument
from chronoq.limits import (
    MAX_CONTROL_KEY,
    MAX_DEBOUNCE,
    MAX_DEBOUNCE_MAX,
    MAX_LABEL_KEY,
    MAX_LABEL_VALUE,
    MAX_LABELS,
    MAX_UNIQUE_FOR,
    Limits,
    default_debounce_max,
    task_bytes,
)
from chronoq.models import Task, TaskDefaults, TaskSpec, TaskState
from chronoq.routing import key_partition, spec_routes, spec_routing_key, submit_partitions

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LIMITS = Limits()
DEFAULTS = TaskDefaults()


def spec(**fields: object) -> TaskSpec:
    return TaskSpec(queue="q", run_at=NOW, **fields)  # type: ignore[arg-type]


def refused(s: TaskSpec) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        LIMITS.check(s, NOW)
    return info.value


def test_a_spec_with_every_control_passes() -> None:
    s = spec(
        concurrency_key="customer-1",
        unique_key="report:7",
        unique_for=timedelta(hours=1),
        debounce_key="sync:7",
        debounce=timedelta(seconds=5),
        debounce_max=timedelta(minutes=1),
        labels=(("team", "billing"), ("tier", "gold")),
    )
    assert LIMITS.check(s, NOW) is s


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"concurrency_key": ""}, "concurrency_key", "must not be empty"),
        ({"concurrency_key": "k" * (MAX_CONTROL_KEY + 1)}, "concurrency_key", "the limit is 128"),
        ({"unique_key": "a\x00b"}, "unique_key", "NUL"),
        ({"debounce_key": "d" * 129, "debounce": timedelta(seconds=1)}, "debounce_key", "128"),
        ({"unique_for": timedelta(hours=1)}, "unique_for", "needs a unique_key"),
        ({"unique_key": "u", "unique_for": timedelta(0)}, "unique_for", "more than 0"),
        ({"unique_key": "u", "unique_for": -timedelta(seconds=1)}, "unique_for", "more than 0"),
        (
            {"unique_key": "u", "unique_for": MAX_UNIQUE_FOR + timedelta(seconds=1)},
            "unique_for",
            "at most 30 days",
        ),
        ({"debounce": timedelta(seconds=1)}, "debounce", "needs a debounce_key"),
        ({"debounce_max": timedelta(seconds=1)}, "debounce_max", "needs a debounce_key"),
        ({"debounce_key": "d"}, "debounce", "is required"),
        ({"debounce_key": "d", "debounce": timedelta(0)}, "debounce", "more than 0"),
        (
            {"debounce_key": "d", "debounce": MAX_DEBOUNCE + timedelta(seconds=1)},
            "debounce",
            "at most 1 days",
        ),
        (
            {
                "debounce_key": "d",
                "debounce": timedelta(minutes=2),
                "debounce_max": timedelta(minutes=1),
            },
            "debounce_max",
            "between the debounce",
        ),
        (
            {
                "debounce_key": "d",
                "debounce": timedelta(minutes=2),
                "debounce_max": MAX_DEBOUNCE_MAX + timedelta(seconds=1),
            },
            "debounce_max",
            "7 days",
        ),
        (
            {"labels": tuple((f"k{i:02}", "v") for i in range(MAX_LABELS + 1))},
            "labels",
            "the limit is 16",
        ),
        ({"labels": (("", "v"),)}, "labels", "must be 1..63 characters"),
        ({"labels": (("k" * (MAX_LABEL_KEY + 1), "v"),)}, "labels", "must be 1..63"),
        ({"labels": (("bad key", "v"),)}, "labels", "[A-Za-z0-9._/-]"),
        ({"labels": (("k", "v" * (MAX_LABEL_VALUE + 1)),)}, "labels", "the limit is 256"),
        ({"labels": (("k", "a\x00"),)}, "labels", "NUL"),
    ],
)
def test_bad_controls_are_refused_naming_the_field(
    fields: dict[str, object], field: str, words: str
) -> None:
    exc = refused(spec(**fields))
    assert exc.field == field
    assert words in exc.message


def test_the_bounds_themselves_pass() -> None:
    LIMITS.check(
        spec(
            concurrency_key="k" * MAX_CONTROL_KEY,
            unique_key="u",
            unique_for=MAX_UNIQUE_FOR,
            debounce_key="d",
            debounce=MAX_DEBOUNCE,
            debounce_max=MAX_DEBOUNCE_MAX,
            labels=tuple((f"k{i:02}", "v" * MAX_LABEL_VALUE) for i in range(MAX_LABELS)),
        ),
        NOW,
    )


def test_debounce_max_defaults_to_ten_debounces_at_most_seven_days() -> None:
    assert default_debounce_max(timedelta(seconds=5)) == timedelta(seconds=50)
    assert default_debounce_max(timedelta(days=1)) == MAX_DEBOUNCE_MAX


def test_the_wire_refuses_too_many_labels_before_reading_them() -> None:
    pb = tasks_pb2.TaskSpec(queue="q", labels={f"k{i}": "v" for i in range(10_000)})
    pb.delay.seconds = 1
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_pb(pb, NOW, DEFAULTS, LIMITS)
    assert info.value.field == "labels"


def _full_pb() -> tasks_pb2.TaskSpec:
    pb = tasks_pb2.TaskSpec(
        queue="q",
        concurrency_key="c",
        unique_key="u",
        debounce_key="d",
        labels={"tier": "gold", "team": "billing"},
    )
    pb.delay.seconds = 10
    pb.unique_for.seconds = 3600
    pb.debounce.seconds = 5
    pb.debounce_max.seconds = 60
    return pb


def test_a_spec_reads_every_control_off_the_wire() -> None:
    s = convert.spec_from_pb(_full_pb(), NOW, DEFAULTS, LIMITS)
    assert (s.concurrency_key, s.unique_key, s.debounce_key) == ("c", "u", "d")
    assert s.unique_for == timedelta(hours=1)
    assert (s.debounce, s.debounce_max) == (timedelta(seconds=5), timedelta(minutes=1))
    assert s.labels == (("team", "billing"), ("tier", "gold"))


def test_a_spec_without_controls_has_none() -> None:
    pb = tasks_pb2.TaskSpec(queue="q")
    pb.delay.seconds = 1
    s = convert.spec_from_pb(pb, NOW, DEFAULTS, LIMITS)
    assert (s.concurrency_key, s.unique_key, s.unique_for, s.debounce_key) == (None,) * 4
    assert (s.debounce, s.debounce_max, s.labels) == (None, None, ())


def test_a_debounced_spec_needs_no_run_at_and_one_without_debounce_does() -> None:
    pb = tasks_pb2.TaskSpec(queue="q", debounce_key="d")
    pb.debounce.seconds = 5
    assert convert.spec_from_pb(pb, NOW, DEFAULTS, LIMITS).run_at == NOW
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_pb(tasks_pb2.TaskSpec(queue="q", unique_key="u"), NOW, DEFAULTS, LIMITS)
    assert info.value.field == "run_at"


def test_a_negative_control_duration_is_refused_on_the_wire() -> None:
    pb = _full_pb()
    pb.debounce.seconds = -5
    with pytest.raises(InvalidArgument) as info:
        convert.spec_from_pb(pb, NOW, DEFAULTS, LIMITS)
    assert info.value.field == "debounce"


def _task(**fields: object) -> Task:
    return Task(
        id="0190a5c0-0000-8100-8000-000000000000",
        namespace="default",
        queue="q",
        state=TaskState.SCHEDULED,
        run_at=NOW,
        partition=3,
        bucket=1,
        **fields,  # type: ignore[arg-type]
    )


def test_a_task_goes_over_the_wire_and_back_with_every_control() -> None:
    task = _task(
        concurrency_key="c",
        unique_key="u",
        unique_until=NOW + timedelta(hours=1),
        debounce_key="d",
        debounce_until=NOW + timedelta(minutes=1),
        labels=(("team", "billing"), ("tier", "gold")),
    )
    pb = convert.task_to_pb(task)
    assert pb.concurrency_key == "c" and dict(pb.labels) == {"team": "billing", "tier": "gold"}
    assert convert.task_from_pb(pb) == task


def test_a_task_without_controls_sends_none() -> None:
    task = _task()
    pb = convert.task_to_pb(task)
    assert not pb.HasField("unique_until") and not pb.HasField("debounce_until")
    assert not pb.concurrency_key and not pb.labels
    assert convert.task_from_pb(pb) == task


def test_keys_and_labels_count_in_a_tasks_answer_bytes() -> None:
    bare = task_bytes(_task())
    keyed = task_bytes(_task(concurrency_key="cc", unique_key="uuu", debounce_key="d"))
    assert keyed == bare + 6
    assert task_bytes(_task(labels=(("k", "v"),))) > bare


def test_the_batch_check_takes_a_spec_with_controls_as_one_alone() -> None:
    """A spec with controls goes the long way: same spec, same refusals, before and after
    specs without them (which keep the quick path)."""
    check = SpecChecker(NOW, DEFAULTS, LIMITS)
    plain = tasks_pb2.TaskSpec(queue="q")
    plain.delay.seconds = 10
    full = _full_pb()
    bad = tasks_pb2.TaskSpec()
    bad.CopyFrom(plain)
    bad.debounce.seconds = 5  # without a debounce_key
    for pb in (plain, full, plain, full):
        assert check(pb) == convert.spec_from_pb(pb, NOW, DEFAULTS, LIMITS)
    with pytest.raises(InvalidArgument) as info:
        check(bad)
    assert info.value.field == "debounce"
    assert check(plain).concurrency_key is None and check(plain).labels == ()


# ---------------------------------------------------------------- routing


def test_the_concurrency_key_places_a_task_before_every_other_key() -> None:
    s = spec(concurrency_key="c", unique_key="u", debounce_key="d", idempotency_key="i")
    assert spec_routing_key(s) == "c"
    assert spec_routing_key(dataclasses.replace(s, concurrency_key=None)) == "u"
    assert spec_routing_key(spec(debounce_key="d", idempotency_key="i")) == "d"
    assert spec_routing_key(spec(idempotency_key="i")) == "i"
    assert spec_routing_key(spec()) is None


keys = st.one_of(st.none(), st.text(min_size=1, max_size=8))


@given(keys, keys, keys, keys, st.integers(1, 4096))
def test_tasks_of_one_key_share_a_partition_whatever_their_other_keys(
    c: str | None, u: str | None, d: str | None, i: str | None, partitions: int
) -> None:
    """Two submits with the same first key land in one partition (so one statement decides
    for that key), however their later keys differ; a batch places each as alone."""
    first = spec(concurrency_key=c, unique_key=u, debounce_key=d, idempotency_key=i)
    # the same keys up to the first present one, other keys after it
    given_keys = [c, u, d, i]
    lead = next((n for n, k in enumerate(given_keys) if k), len(given_keys))
    changed = [k if n <= lead else f"other-{n}" for n, k in enumerate(given_keys)]
    other = spec(
        concurrency_key=changed[0],
        unique_key=changed[1],
        debounce_key=changed[2],
        idempotency_key=changed[3],
    )
    routes = spec_routes([first, other])
    assert routes[0] == ("default", spec_routing_key(first))
    key = spec_routing_key(first)
    if key is not None:
        placed = submit_partitions(routes, partitions)
        assert placed[0] == placed[1] == key_partition("default", key, partitions)
