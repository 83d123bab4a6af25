"""The request bounds (chronoq.limits) and the pb -> model conversion refuse what the store and
the background loops could not process, with a short message naming the field."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoq.api import convert
from chronoq.api.v1 import schedules_pb2, tasks_pb2, worker_pb2
from chronoq.errors import ECHO_LIMIT, MESSAGE_LIMIT, InvalidArgument, shown
from chronoq.limits import (
    MAX_ERROR_MESSAGE,
    MAX_LEASE_TOKEN,
    Limits,
    check_count,
    check_name,
    check_rate,
    check_text,
    failure_message,
)
from chronoq.models import ScheduleSpec, TaskDefaults, TaskSpec
from chronoq.recurrence import CatchUp, Cron, Every
from chronoq.recurrence import check as check_rule

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
LIMITS = Limits()
DEFAULTS = TaskDefaults()


def refused(field: str) -> pytest.RaisesContext[InvalidArgument]:
    return pytest.raises(InvalidArgument, match=rf"^{field}: ")


@pytest.mark.parametrize("name", ["q\n", "\nq", "q\x00", "a b", "é", "a/b", ""])
def test_names_must_match_whole(name: str) -> None:
    with refused("queue"):
        check_name("queue", name)


def test_echoed_values_are_cut_short() -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_name("queue", "!" * 100)
    assert len(caught.value.message) < 200 and "\u2026" in caught.value.message
    assert len(shown("x" * 100_000)) == ECHO_LIMIT
    assert len(InvalidArgument("f", "y" * 100_000).message) == MESSAGE_LIMIT


def test_text_fields_refuse_nul_and_length() -> None:
    assert check_text("worker_id", "w-1", 10) == "w-1"
    with refused("worker_id"):
        check_text("worker_id", "w\x00", 10)
    with refused("worker_id"):
        check_text("worker_id", "w" * 11, 10)


def test_failure_message_is_cleaned_not_refused() -> None:
    cleaned = failure_message("boom\x00" + "x" * 10_000)
    assert "\x00" not in cleaned and cleaned.startswith("boom\ufffd")
    assert len(cleaned) == MAX_ERROR_MESSAGE


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 1e12])
def test_rates_must_be_finite_and_bounded(value: float) -> None:
    with refused("rate"):
        check_rate("rate", value, 1e6)


def test_repeated_fields_are_capped() -> None:
    assert check_count("leases", 1000, 1000) == 1000
    with pytest.raises(InvalidArgument, match="leases: holds 1001 entries; the limit is 1000"):
        check_count("leases", 1001, 1000)


def task(**fields: object) -> TaskSpec:
    fields.setdefault("queue", "q")
    fields.setdefault("run_at", NOW)
    return TaskSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (task(misfire_grace=timedelta(days=10_000)), "misfire_grace"),
        (
            task(backoff_initial=timedelta(days=10_000), backoff_max=timedelta(days=10_001)),
            "retry.backoff_initial",
        ),
        (task(backoff_max=timedelta(days=10_000)), "retry.backoff_max"),
        (task(lease_timeout=timedelta(days=10_000)), "lease_timeout"),
        (task(lease_timeout=timedelta(0)), "lease_timeout"),
        (task(run_at=datetime(9999, 12, 31, tzinfo=UTC)), "run_at"),
        (task(run_at=datetime(1, 1, 1, tzinfo=UTC)), "run_at"),
        (task(idempotency_key="k\x00"), "idempotency_key"),
        (task(idempotency_key="k" * 513), "idempotency_key"),
        (task(priority=2**31), "priority"),
        (task(queue="q\n"), "queue"),
    ],
)
def test_task_bounds(spec: TaskSpec, field: str) -> None:
    with refused(field):
        LIMITS.check(spec, NOW)


def schedule(rule: Cron | Every, **fields: object) -> ScheduleSpec:
    fields.setdefault("name", "s")
    fields.setdefault("queue", "q")
    return ScheduleSpec(rule=rule, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (schedule(Cron("0 0 31 2 *")), "cron"),
        (schedule(Cron("* * * * * *")), "cron"),
        (schedule(Cron("*" * 300)), "cron"),
        (schedule(Cron("* * * * *", "America")), "timezone"),
        (schedule(Cron("* * * * *", "../etc")), "timezone"),
        (schedule(Cron("* * * * *", "zone.tab")), "timezone"),
        (schedule(Cron("* * * * *", "Europe/Paris\x00")), "timezone"),
        (schedule(Every(timedelta(days=10_000), NOW)), "interval"),
        (schedule(Every(timedelta(milliseconds=10), NOW)), "interval"),
        (
            schedule(Every(timedelta(minutes=1), NOW), start_at=datetime(9999, 1, 1, tzinfo=UTC)),
            "start_at",
        ),
        (schedule(Cron("* * * * *"), name="s\n"), "name"),
        (schedule(Cron("* * * * *"), lease_timeout=timedelta(days=10_000)), "lease_timeout"),
        (schedule(Cron("* * * * *"), max_attempts=0), "max_attempts"),
        (schedule(Cron("* * * * *"), payload=b"x" * (256 * 1024 + 1)), "payload"),
    ],
)
def test_schedule_bounds(spec: ScheduleSpec, field: str) -> None:
    with refused(field):
        LIMITS.check_schedule(spec, NOW)


def test_valid_schedules_pass() -> None:
    for rule in (Cron("*/5 * * * *", "Europe/Paris"), Cron("0 0 29 2 *"), Every(timedelta(1), NOW)):
        LIMITS.check_schedule(schedule(rule), NOW)
    check_rule(Cron("0 0 31 2 *"))  # without a time, only the syntax is checked


def test_out_of_range_enums_are_refused() -> None:
    pb = tasks_pb2.TaskSpec(queue="q", misfire_policy=7)  # type: ignore[arg-type]
    pb.delay.FromSeconds(1)
    with refused("misfire_policy"):
        convert.spec_from_pb(pb, NOW, DEFAULTS)
    spec = schedules_pb2.ScheduleSpec(name="s", queue="q", cron="* * * * *", catch_up=-1)  # type: ignore[arg-type]
    with refused("catch_up"):
        convert.schedule_spec_from_pb(spec, NOW, DEFAULTS)
    assert (
        convert.schedule_spec_from_pb(
            schedules_pb2.ScheduleSpec(name="s", queue="q", cron="* * * * *"), NOW, DEFAULTS
        ).catch_up
        is CatchUp.LATEST
    )
    with refused("state"):
        convert.state_from_pb(99)


def test_a_huge_delay_is_refused_before_it_overflows() -> None:
    pb = tasks_pb2.TaskSpec(queue="q")
    pb.delay.seconds = 315_576_000_000  # the largest protobuf Duration
    with refused("delay"):
        convert.spec_from_pb(pb, NOW, DEFAULTS, LIMITS)


def test_lease_tokens_fit_the_store() -> None:
    with refused("lease.lease_token"):
        convert.lease_from_pb(worker_pb2.Lease(task_id="t", lease_token=MAX_LEASE_TOKEN + 1))
    with refused("lease.task_id"):
        convert.lease_from_pb(worker_pb2.Lease(task_id="t" * 100, lease_token=1))


def test_namespaces_are_checked_where_they_are_read() -> None:
    assert convert.namespace_of("") == "default"
    with refused("namespace"):
        convert.namespace_of("ns\x00")


@settings(database=None)
@given(
    queue=st.text(max_size=200),
    key=st.one_of(st.none(), st.text(max_size=600)),
    seconds=st.integers(-(10**12), 10**12),
    grace=st.integers(0, 10**12),
)
def test_any_task_is_accepted_or_refused_cleanly(
    queue: str, key: str | None, seconds: int, grace: int
) -> None:
    """Whatever the values, the check either passes or raises InvalidArgument (no other error),
    and whatever it passes is within the bounds."""
    try:
        spec = task(
            queue=queue,
            idempotency_key=key,
            run_at=NOW + timedelta(seconds=seconds),
            misfire_grace=timedelta(seconds=grace),
        )
    except OverflowError:
        return
    try:
        LIMITS.check(spec, NOW)
    except InvalidArgument as exc:
        assert len(exc.message) <= MESSAGE_LIMIT
        return
    assert spec.run_at - NOW <= LIMITS.horizon and spec.misfire_grace <= LIMITS.horizon
    assert "\x00" not in (key or "") and queue.strip() == queue
