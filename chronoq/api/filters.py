"""Protobuf ↔ task filters and bulk answers (``chronoq.taskfilter``), checked as they come in."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2
from chronoq.errors import InvalidArgument
from chronoq.limits import MAX_LABEL_FILTERS, MAX_TASK_ID, check_text
from chronoq.models import TaskState
from chronoq.taskfilter import BulkOutcome, TaskFilter, checked_filter


def _instant(pb: Any, name: str, field: str) -> datetime | None:
    return convert.from_timestamp(field + name, getattr(pb, name)) if pb.HasField(name) else None


def _labels(pb: Any, field: str) -> list[tuple[str, str]]:
    if len(pb.labels) > MAX_LABEL_FILTERS:  # counted before any entry is looked at
        raise InvalidArgument(
            field + "labels", f"holds {len(pb.labels)} pairs; the limit is {MAX_LABEL_FILTERS}"
        )
    return list(pb.labels.items())


def list_filter(request: tasks_pb2.ListTasksRequest, state: TaskState | None) -> TaskFilter:
    """The filter of a listing (its state given apart: ListDead's is DEAD)."""
    return checked_filter(
        queue=request.queue or None,
        labels=_labels(request, ""),
        state=state,
        run_at_from=_instant(request, "run_at_from", ""),
        run_at_to=_instant(request, "run_at_to", ""),
    )


def filter_from_pb(pb: tasks_pb2.TaskFilter, field: str = "filter.") -> TaskFilter:
    """A bulk operation's filter, each field's errors named under ``field``."""
    try:
        state = convert.state_from_pb(pb.state)
    except InvalidArgument as exc:
        raise InvalidArgument(field + "state", exc.message.split(": ", 1)[-1]) from None
    return checked_filter(
        queue=pb.queue or None,
        labels=_labels(pb, field),
        state=state,
        run_at_from=_instant(pb, "run_at_from", field),
        run_at_to=_instant(pb, "run_at_to", field),
        field=field,
    )


def filter_to_pb(where: TaskFilter) -> tasks_pb2.TaskFilter:
    return tasks_pb2.TaskFilter(
        queue=where.queue or "",
        labels=dict(where.labels),
        state=tasks_pb2.TASK_STATE_UNSPECIFIED
        if where.state is None
        else convert.state_to_pb(where.state),
        run_at_from=convert.to_timestamp(where.run_at_from),
        run_at_to=convert.to_timestamp(where.run_at_to),
    )


def bulk_token(token: str) -> str:
    """A bulk request's page token, bounded (the store says whether it is one of its own)."""
    return check_text("page_token", token, MAX_TASK_ID)


def outcome_to_pb(outcome: BulkOutcome) -> tasks_pb2.BulkResponse:
    return tasks_pb2.BulkResponse(
        count=outcome.count,
        more=outcome.more,
        next_page_token=outcome.next_token,
        dry_run=outcome.dry_run,
    )


def outcome_from_pb(pb: tasks_pb2.BulkResponse) -> BulkOutcome:
    return BulkOutcome(pb.count, pb.next_page_token, pb.dry_run)
