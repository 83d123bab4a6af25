"""How commands show what they got: JSON, times, task states, task tables."""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from chronoq.durations import format_duration
from chronoq.models import Task, TaskState


def plain(value: Any) -> Any:
    """A JSON-ready copy: enums by name, times in ISO 8601, durations in seconds."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return payload_text(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def payload_text(payload: bytes) -> str:
    """A payload as text: UTF-8 as is, anything else in base64."""
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(payload).decode()


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout."""
    typer.echo(json.dumps(plain(value), indent=2))


def when(value: datetime | None) -> str:
    """A time in ISO 8601 to the millisecond, or "-"."""
    return value.isoformat(timespec="milliseconds") if value is not None else "-"


def utc(value: datetime) -> str:
    """Compact UTC time for table cells (the column header says UTC)."""
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S.%f}"[:-3]


def short(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


_STATE_STYLE = {
    TaskState.SCHEDULED: "cyan",
    TaskState.READY: "yellow",
    TaskState.RUNNING: "blue",
    TaskState.SUCCEEDED: "green",
    TaskState.DEAD: "red",
    TaskState.CANCELLED: "dim",
    TaskState.SKIPPED: "dim",
}


def state(value: TaskState) -> str:
    """A task state in its colour."""
    return f"[{_STATE_STYLE[value]}]{value.name}[/]"


def task_table(task: Task) -> Table:
    """Every field of one task."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, str]] = [
        ("id", task.id),
        ("namespace", task.namespace),
        ("queue", task.queue),
        ("state", state(task.state)),
        ("run_at", when(task.run_at)),
        ("attempt", f"{task.attempt} of {task.max_attempts}"),
        ("priority", str(task.priority)),
        ("partition / bucket", f"{task.partition} / {task.bucket}"),
        ("idempotency_key", escape(task.idempotency_key or "-")),
        ("payload", escape(short(payload_text(task.payload), 200))),
        ("lease_timeout", format_duration(task.lease_timeout)),
        ("misfire", f"{task.misfire_policy.name} (grace {format_duration(task.misfire_grace)})"),
        ("created_at", when(task.created_at)),
        ("fired_at", when(task.fired_at)),
        ("lease_until", when(task.lease_until)),
        ("worker_id", escape(task.worker_id or "-")),
        ("finished_at", when(task.finished_at)),
        ("last_error", escape(task.last_error or "-")),
        *_control_rows(task),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _control_rows(task: Task) -> list[tuple[str, str]]:
    """The queue controls a task carries (none: no rows)."""
    rows = [
        (name, escape(value))
        for name, value in (
            ("concurrency_key", task.concurrency_key),
            ("unique_key", task.unique_key),
            ("debounce_key", task.debounce_key),
        )
        if value is not None
    ]
    if task.unique_until is not None:
        rows.append(("unique_until", when(task.unique_until)))
    if task.debounce_until is not None:
        rows.append(("debounce_until", when(task.debounce_until)))
    if task.labels:
        rows.append(("labels", escape(", ".join(f"{k}={v}" for k, v in task.labels))))
    return rows


def tasks_table(tasks: Sequence[Task], *, title: str, errors: bool = False) -> Table:
    """One line per task, with its payload or (``errors``) its last error."""
    table = Table(title=title, title_justify="left")
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("queue", "state", "run_at (UTC)", "attempt"):
        table.add_column(column)
    table.add_column("last error" if errors else "payload", overflow="fold")
    for t in tasks:
        detail = t.last_error or "" if errors else payload_text(t.payload)
        table.add_row(
            t.id,
            escape(t.queue),
            state(t.state),
            utc(t.run_at),
            f"{t.attempt}/{t.max_attempts}",
            escape(short(detail, 60)),
        )
    return table
