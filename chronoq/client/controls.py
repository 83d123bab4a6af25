"""A task's queue controls on the client side: the keys, windows and labels a submit sends
(``NewTask``), and a task definition's defaults for them, each a value or a function of the
payload (``concurrency_key=lambda data: data["customer"]``), resolved at each submit.

The node checks them (``chronoq.limits.check_controls``); nothing is checked twice here, but
a function that fails or answers a wrong type is refused before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Protocol, TypeAlias

from chronoq import errors
from chronoq.api.v1 import tasks_pb2

#: A key default: a key, a function of the payload giving one (None: no key), or None.
KeyOption: TypeAlias = str | Callable[[Any], str | None] | None
#: A labels default: labels, a function of the payload giving them, or None.
LabelsOption: TypeAlias = Mapping[str, str] | Callable[[Any], Mapping[str, str] | None] | None

#: The fields a task definition may give as a function of the payload.
KEY_FIELDS = ("concurrency_key", "unique_key", "debounce_key")
#: The duration fields of the controls.
WINDOW_FIELDS = ("unique_for", "debounce", "debounce_max")
#: Every ``NewTask`` field of the queue controls.
FIELDS = (*KEY_FIELDS, *WINDOW_FIELDS, "labels")


class Controlled(Protocol):
    """What carries a task's controls (``NewTask``)."""

    @property
    def concurrency_key(self) -> str | None: ...
    @property
    def unique_key(self) -> str | None: ...
    @property
    def unique_for(self) -> timedelta | None: ...
    @property
    def debounce_key(self) -> str | None: ...
    @property
    def debounce(self) -> timedelta | None: ...
    @property
    def debounce_max(self) -> timedelta | None: ...
    @property
    def labels(self) -> Mapping[str, str] | None: ...


def resolved(fields: dict[str, Any], payload: Any) -> dict[str, Any]:
    """``fields`` with each key or labels given as a function replaced by its answer for
    ``payload``; a function that raises, or answers other than a string (labels: a mapping
    of strings) or None, is refused naming its field."""
    out = dict(fields)
    for name in (*KEY_FIELDS, "labels"):
        value = out.get(name)
        if not callable(value):
            continue
        try:
            answer = value(payload)
        except Exception as exc:
            raise errors.BadRequest(
                f"{name}: the function computing it from the payload raised {exc!r}"
            ) from exc
        out[name] = _checked_answer(name, answer)
    return out


def _checked_answer(name: str, answer: Any) -> Any:
    if answer is None:
        return None
    if name == "labels":
        if not isinstance(answer, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in answer.items()
        ):
            raise errors.BadRequest("labels: the function must answer a dict of strings or None")
        return dict(answer)
    if not isinstance(answer, str):
        raise errors.BadRequest(
            f"{name}: the function must answer a string or None, not {type(answer).__name__}"
        )
    return answer


def has_controls(task: Controlled) -> bool:
    """Whether ``task`` sets any queue control (most do not: their encoding skips this)."""
    return bool(
        task.concurrency_key
        or task.unique_key
        or task.debounce_key
        or task.labels
        or task.unique_for is not None
        or task.debounce is not None
        or task.debounce_max is not None
    )


def write(pb: tasks_pb2.TaskSpec, task: Controlled) -> None:
    """``task``'s queue controls into its wire spec."""
    pb.concurrency_key = task.concurrency_key or ""
    pb.unique_key = task.unique_key or ""
    pb.debounce_key = task.debounce_key or ""
    for name in WINDOW_FIELDS:
        value: timedelta | None = getattr(task, name)
        if value is not None:
            getattr(pb, name).FromTimedelta(value)
    if task.labels:
        pb.labels.update(task.labels)
