"""The edge of bulk operations by filter: the request checked, a namespace's concurrent calls
bounded on this node, the call's work bounded by its deadline, its effects applied.

The walk itself (bounded batches, each its own statement) is the store's
(``chronoq.store.bulk``); here a namespace holds at most ``MAX_BULK_PER_NAMESPACE`` calls at
once on a node, so one tenant's bulk work takes a bounded share of the store's connections.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chronoq.api import convert, filters
from chronoq.api.v1 import tasks_pb2
from chronoq.clock import Clock
from chronoq.errors import InvalidArgument, TooManyBulkCalls
from chronoq.limits import BULK_DEADLINE_S, MAX_BULK_PER_NAMESPACE, MAX_BULK_TASKS, check_name
from chronoq.node.dispatch.dispatcher import Dispatch
from chronoq.store.port import TaskStore
from chronoq.taskfilter import BulkAction, TaskFilter

#: Seconds a bulk call keeps for its answer before the caller's deadline.
ANSWER_MARGIN_S = 2.0
#: The least a call works, however close its deadline (one round of batches).
LEAST_WORK_S = 0.5


class BulkSlots:
    """Bulk calls running per namespace on this node, at most ``per_namespace`` each (an
    entry exists only while a call of its namespace runs)."""

    def __init__(self, per_namespace: int = MAX_BULK_PER_NAMESPACE) -> None:
        self.per_namespace = per_namespace
        self._running: dict[str, int] = {}

    @contextmanager
    def slot(self, namespace: str) -> Iterator[None]:
        held = self._running.get(namespace, 0)
        if held >= self.per_namespace:
            raise TooManyBulkCalls(namespace, self.per_namespace)
        self._running[namespace] = held + 1
        try:
            yield
        finally:
            left = self._running[namespace] - 1
            if left:
                self._running[namespace] = left
            else:
                del self._running[namespace]

    def running(self, namespace: str) -> int:
        return self._running.get(namespace, 0)


def checked_where(request: tasks_pb2.BulkRequest) -> TaskFilter:
    """The request's filter; an empty one is refused (it would match every task of the
    namespace: say so with a state, a queue, a label or a run_at range)."""
    where = filters.filter_from_pb(request.filter) if request.HasField("filter") else TaskFilter()
    if where.queue is None and where.state is None and not where.narrowed:
        raise InvalidArgument(
            "filter",
            "name a queue, a label, a state or a run_at range (an empty filter would match "
            "every task of the namespace)",
        )
    return where


async def bulk_call(
    action: BulkAction,
    request: tasks_pb2.BulkRequest,
    context: Any,
    *,
    store: TaskStore,
    clock: Clock,
    dispatch: Dispatch,
    slots: BulkSlots,
) -> tasks_pb2.BulkResponse:
    """One CancelWhere, RequeueWhere or RunNowWhere call."""
    namespace = check_name("namespace", convert.namespace_of(request.namespace))
    where = checked_where(request)
    if request.max_tasks > MAX_BULK_TASKS:
        raise InvalidArgument(
            "max_tasks", f"is {request.max_tasks}; the limit is {MAX_BULK_TASKS} per call"
        )
    token = filters.bulk_token(request.page_token)
    deadline = BULK_DEADLINE_S
    remaining = context.time_remaining() if context is not None else None
    if remaining is not None:
        deadline = max(LEAST_WORK_S, min(deadline, remaining - ANSWER_MARGIN_S))
    with slots.slot(namespace):
        now = clock.now()
        done = await store.bulk_where(
            action,
            namespace,
            where,
            now,
            dry_run=request.dry_run,
            page_token=token,
            max_tasks=request.max_tasks or MAX_BULK_TASKS,
            deadline_s=deadline,
        )
    dispatch.apply(done.effects, now)
    return filters.outcome_to_pb(done.outcome)
