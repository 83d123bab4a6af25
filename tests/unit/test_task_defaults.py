"""Task defaults are written once (``TaskDefaults``); specs, tasks and the node follow them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from chronoq.config import NodeSettings
from chronoq.models import TASK_DEFAULTS, ScheduleSpec, Task, TaskSpec, TaskState
from chronoq.recurrence import Every

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _same_as_defaults(obj: object) -> None:
    for f in dataclasses.fields(TASK_DEFAULTS):
        if hasattr(obj, f.name):
            assert getattr(obj, f.name) == getattr(TASK_DEFAULTS, f.name), f.name


def test_models_take_the_task_defaults() -> None:
    _same_as_defaults(TaskSpec(queue="q", run_at=NOW))
    _same_as_defaults(
        Task(id="t", namespace="n", queue="q", state=TaskState.SCHEDULED, run_at=NOW,
             partition=0, bucket=0)
    )
    _same_as_defaults(ScheduleSpec(name="s", queue="q", rule=Every(interval=timedelta(seconds=60), anchor=NOW)))


def test_the_node_serves_the_task_defaults() -> None:
    assert NodeSettings(dsn="postgresql://localhost/chronoq").defaults == TASK_DEFAULTS
