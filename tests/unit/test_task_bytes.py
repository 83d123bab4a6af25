"""A task's cost in an answer is counted in Python as the store's ``task_bytes`` fragment
counts it in SQL (pure): bytes, not characters, every variable-length column, NULL as 0, and
the trace context at the size ``pg_column_size`` reads of its ``jsonb``."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from chronoq import tracecontext
from chronoq.limits import TASK_FIXED_BYTES, task_bytes
from chronoq.models import Task, TaskState

BARE = Task(
    id="t", namespace="default", queue="q", state=TaskState.READY,
    run_at=datetime(2024, 1, 1, tzinfo=UTC), partition=0, bucket=0,
)
TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


def test_a_bare_task_costs_its_names_and_the_fixed_part() -> None:
    assert task_bytes(BARE) == len("default") + len("q") + TASK_FIXED_BYTES


def test_text_counts_in_utf8_bytes_not_characters() -> None:
    task = replace(BARE, queue="qé", idempotency_key="ключ", last_error="échec")
    extra = (len("qé".encode()) - 1) + len("ключ".encode()) + len("échec".encode())
    assert extra == 2 + 8 + 6
    assert task_bytes(task) == task_bytes(BARE) + extra


def test_fired_by_worker_and_a_set_content_type_count_and_the_default_does_not() -> None:
    task = replace(BARE, fired_by="node-1/7", worker_id="w-1", content_type="text/plain")
    assert task_bytes(task) == task_bytes(BARE) + 8 + 3 + 10
    # The default content type is stored as NULL, which the fragment counts as 0.
    assert task_bytes(replace(BARE, content_type="application/octet-stream")) == task_bytes(BARE)


@pytest.mark.parametrize(
    ("carrier", "stored"),
    [
        # pg_column_size of each, stored in a task row on PostgreSQL (read once, kept here)
        ((), 0),
        ((("traceparent", TRACEPARENT),), 79),
        ((("a", "x" * 100),), 114),
        ((("a", "x" * 112),), 126),
        ((("a", "x" * 113),), 127),  # the largest with a 1-byte header
        ((("a", "x" * 114),), 131),
        ((("a", "x" * 113), ("b", "y")), 140),
        (tuple((f"k{i}", "z" * 500) for i in range(3)), 1538),
    ],
)
def test_the_trace_context_counts_as_its_stored_jsonb(
    carrier: tracecontext.Carrier, stored: int
) -> None:
    assert tracecontext.stored_bytes(carrier) == stored
    assert task_bytes(replace(BARE, trace_context=carrier)) == task_bytes(BARE) + stored
