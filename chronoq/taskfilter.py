"""Which tasks of a namespace a listing or a bulk operation means, and what each bulk
operation does to them. Pure: the store turns a filter into SQL, the edge checks it.

A bulk operation walks the namespace's tasks in the states it changes, in id order, one
bounded batch per statement (``chronoq.store.bulk``); the filter narrows them by queue,
labels (every pair given must match) and a run_at range ``[run_at_from, run_at_to)``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from chronoq.effects import NO_EFFECTS, Effects
from chronoq.errors import InvalidArgument
from chronoq.limits import MAX_LABEL_FILTERS, check_labels, check_name
from chronoq.models import TaskState


class BulkAction(enum.Enum):
    """A change of many tasks by filter; its value names it in errors and logs."""

    CANCEL = "cancel"
    REQUEUE = "requeue"
    RUN_NOW = "run-now"

    @property
    def sources(self) -> frozenset[TaskState]:
        """The states a task must be in for the action to change it."""
        return _SOURCES[self]

    @property
    def target(self) -> TaskState:
        """The state the action leaves a task in."""
        return TaskState.CANCELLED if self is BulkAction.CANCEL else TaskState.READY


_SOURCES = {
    # A DEAD task may be cancelled too: an operator discards dead letters that way.
    BulkAction.CANCEL: frozenset(
        {TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING, TaskState.DEAD}
    ),
    BulkAction.REQUEUE: frozenset({TaskState.DEAD}),
    BulkAction.RUN_NOW: frozenset({TaskState.SCHEDULED}),
}


@dataclass(frozen=True)
class TaskFilter:
    """Tasks of one namespace: of ``queue`` (None: any), carrying every pair of ``labels``
    (sorted pairs; none: any), in ``state`` (None: any), with ``run_at`` in
    ``[run_at_from, run_at_to)`` (an open end: unbounded)."""

    queue: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    state: TaskState | None = None
    run_at_from: datetime | None = None
    run_at_to: datetime | None = None

    @property
    def narrowed(self) -> bool:
        """Whether the filter says more than queue and state (labels or a run_at range)."""
        return bool(self.labels) or self.run_at_from is not None or self.run_at_to is not None

    def labels_json(self) -> str | None:
        """The labels as the JSON object a stored task's labels must contain (None: any)."""
        if not self.labels:
            return None
        return json.dumps(dict(self.labels), separators=(",", ":"), sort_keys=True)

    def states_for(self, action: BulkAction) -> list[TaskState]:
        """The states ``action`` walks under this filter (ascending; empty: nothing to do)."""
        chosen = action.sources if self.state is None else action.sources & {self.state}
        return sorted(chosen)


def checked_filter(
    *,
    queue: str | None,
    labels: Iterable[tuple[str, str]],
    state: TaskState | None,
    run_at_from: datetime | None,
    run_at_to: datetime | None,
    field: str = "",
) -> TaskFilter:
    """A filter from what a caller sent, or ``InvalidArgument`` naming the field to fix
    (``field`` prefixes the names, e.g. ``filter.``): a queue name, at most
    ``MAX_LABEL_FILTERS`` label pairs bounded as a task's labels are, each key once, and a
    range whose start is before its end."""
    if queue:
        check_name(field + "queue", queue)
    pairs = list(labels)
    if len(pairs) > MAX_LABEL_FILTERS:
        raise InvalidArgument(
            field + "labels", f"holds {len(pairs)} pairs; the limit is {MAX_LABEL_FILTERS}"
        )
    check_labels(pairs, field + "labels")
    keys = [k for k, _v in pairs]
    if len(set(keys)) != len(keys):
        raise InvalidArgument(field + "labels", "names a key twice; give each key once")
    if run_at_from is not None and run_at_to is not None and run_at_from >= run_at_to:
        raise InvalidArgument(field + "run_at_to", "must be after run_at_from")
    return TaskFilter(
        queue=queue or None,
        labels=tuple(sorted(pairs)),
        state=state,
        run_at_from=run_at_from,
        run_at_to=run_at_to,
    )


def parse_label(text: str) -> tuple[str, str]:
    """``k=v`` as a (key, value) pair (the CLI's ``--label``); the value may hold ``=``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InvalidArgument("label", f"{text!r} is not key=value")
    return key, value


@dataclass(frozen=True)
class BulkOutcome:
    """What one bulk call did: ``count`` tasks changed (a dry run: matched), and where the
    walk stopped (``next_token``; empty: every matching task was reached)."""

    count: int
    next_token: str = ""
    dry_run: bool = False

    @property
    def more(self) -> bool:
        """Whether more tasks may match past where this call stopped (call again)."""
        return bool(self.next_token)


@dataclass(frozen=True)
class BulkDone:
    """A bulk call's answer and what its writes did (READY tasks wake claims)."""

    outcome: BulkOutcome
    effects: Effects = field(default=NO_EFFECTS)
