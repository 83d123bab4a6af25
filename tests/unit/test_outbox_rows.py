"""An outbox row is checked and encoded as ``submit`` would send it, before any insert."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from chronoq.errors import InvalidArgument
from chronoq.outbox.relay import _refused_index
from chronoq.outbox.rows import new_row, spec_of
from chronoq.outbox.schema import MIGRATIONS, migration_sql

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)


def test_the_row_id_is_the_idempotency_key_unless_the_caller_gives_one() -> None:
    row = new_row("mail", {"payload": {"to": "a@b.c"}}, now=NOW)
    spec = spec_of(row.spec)
    assert spec.idempotency_key == str(row.id)
    assert (spec.queue, spec.namespace, row.namespace) == ("mail", "default", "default")
    assert spec.payload == b'{"to":"a@b.c"}' and spec.content_type == "application/json"
    own = spec_of(new_row("mail", {"idempotency_key": "order-7"}, now=NOW).spec)
    assert own.idempotency_key == "order-7"


def test_a_delay_counts_from_the_enqueue_not_from_the_relay() -> None:
    spec = spec_of(new_row("mail", {"delay": timedelta(minutes=10)}, now=NOW).spec)
    assert spec.WhichOneof("when") == "run_at"
    assert spec.run_at.ToDatetime(tzinfo=UTC) == NOW + timedelta(minutes=10)


def test_rows_are_time_ordered() -> None:
    ids = [new_row("q", {}, now=NOW).id for _ in range(50)]
    assert [i.bytes[:6] for i in ids] == sorted(i.bytes[:6] for i in ids)


def test_queue_controls_travel_in_the_spec() -> None:
    fields = {"unique_key": "u", "debounce_key": "d", "debounce": timedelta(seconds=5),
              "labels": {"tenant": "t1"}, "concurrency_key": "c"}
    spec = spec_of(new_row("q", fields, now=NOW).spec)
    assert (spec.unique_key, spec.debounce_key, spec.concurrency_key) == ("u", "d", "c")
    assert dict(spec.labels) == {"tenant": "t1"}


@pytest.mark.parametrize(
    ("queue", "fields", "field"),
    [
        ("has space", {}, "queue"),
        ("q", {"delay": timedelta(days=400)}, "delay"),
        ("q", {"delay": timedelta(seconds=-1)}, "delay"),
        ("q", {"run_at": NOW, "delay": timedelta(seconds=1)}, "delay"),
        ("q", {"run_at": datetime(1960, 1, 1, tzinfo=UTC)}, "run_at"),
        ("q", {"payload": b"x" * (256 * 1024 + 1)}, "payload"),
        ("q", {"payload": {"x": object()}}, "payload"),
        ("q", {"max_attempts": 0}, "max_attempts"),
        ("q", {"labels": {"bad key!": "v"}}, "labels"),
        ("q", {"debounce_key": "k"}, "debounce"),
        ("q", {"colour": "red"}, "fields"),
        ("q", {"namespace": "other"}, "namespace"),
    ],
)
def test_what_submit_refuses_is_refused_naming_the_field(
    queue: str, fields: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        new_row(queue, fields, now=NOW)
    assert field in caught.value.message


def test_a_namespace_is_checked() -> None:
    with pytest.raises(InvalidArgument, match="namespace"):
        new_row("q", {}, namespace="no spaces", now=NOW)


def test_bytes_that_are_no_spec_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="not a serialized TaskSpec"):
        spec_of(b"\xff")


def test_the_refused_task_of_a_batch_is_found_from_the_message() -> None:
    assert _refused_index("INVALID_ARGUMENT: tasks[3].payload: too big", 5) == 3
    assert _refused_index("tasks[0].queue: bad", 1) == 0
    assert _refused_index("INVALID_ARGUMENT: tasks[9].queue: bad", 5) is None  # not ours
    assert _refused_index("INVALID_ARGUMENT: tasks: holds 6 tasks", 6) is None


def test_migrations_are_numbered_in_order_and_given_whole_to_other_tools() -> None:
    versions = [v for v, _ in MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1))
    assert "CREATE TABLE chronoq_outbox (" in migration_sql()
