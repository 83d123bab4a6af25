"""The client's bulk operations by filter: cancel, requeue and run now many tasks at once.

Each call to the node changes at most ``MAX_BULK_TASKS`` tasks and answers where it stopped;
these methods call again from there until nothing is left (or ``max_tasks`` is reached), and
answer the total. A call retried on another node after a failover goes on from the same
token: what the lost call had changed is done, but not in the total.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chronoq.api import filters
from chronoq.api.v1 import tasks_pb2
from chronoq.limits import MAX_BULK_TASKS
from chronoq.models import TaskState
from chronoq.taskfilter import BulkOutcome, TaskFilter

#: A stub's method of a node (``chronoq.client.client.Method``, not imported: a cycle).
Method = Callable[[Any], Any]


class BulkCalls:
    """``Client``'s bulk operations (a part of it; it needs the client's ``_call``)."""

    namespace: str

    if TYPE_CHECKING:

        async def _call(
            self,
            method: Method,
            request: Any,
            *,
            timeout: float | None = None,
            retry: bool = False,
        ) -> Any: ...

    async def cancel_where(
        self,
        *,
        queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        state: TaskState | None = None,
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
        dry_run: bool = False,
        max_tasks: int | None = None,
    ) -> BulkOutcome:
        """Cancel every task of this namespace that the filter matches and has not finished
        (SCHEDULED, READY, RUNNING: its worker learns it by heartbeat) or is DEAD. The
        filter: one queue, every one of ``labels``, one state, run_at in ``[run_at_from,
        run_at_to)``. ``dry_run``: count, change nothing. ``max_tasks``: stop after this many
        (the answer's ``more`` says whether some are left)."""
        where = TaskFilter(queue, _pairs(labels), state, run_at_from, run_at_to)
        return await self._where(lambda n: n.tasks.CancelWhere, where, dry_run, max_tasks)

    async def requeue_where(
        self,
        *,
        queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
        dry_run: bool = False,
        max_tasks: int | None = None,
    ) -> BulkOutcome:
        """Requeue the DEAD tasks the filter matches: READY now, a fresh attempt budget."""
        where = TaskFilter(queue, _pairs(labels), TaskState.DEAD, run_at_from, run_at_to)
        return await self._where(lambda n: n.tasks.RequeueWhere, where, dry_run, max_tasks)

    async def run_now_where(
        self,
        *,
        queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
        dry_run: bool = False,
        max_tasks: int | None = None,
    ) -> BulkOutcome:
        """Run the SCHEDULED tasks the filter matches now: READY at once (a paused queue
        still holds them until it resumes)."""
        where = TaskFilter(queue, _pairs(labels), TaskState.SCHEDULED, run_at_from, run_at_to)
        return await self._where(lambda n: n.tasks.RunNowWhere, where, dry_run, max_tasks)

    async def _where(
        self, method: Method, where: TaskFilter, dry_run: bool, max_tasks: int | None
    ) -> BulkOutcome:
        total, token = 0, ""
        while True:
            left = MAX_BULK_TASKS if max_tasks is None else max_tasks - total
            if left <= 0:
                return BulkOutcome(total, token, dry_run)
            req = tasks_pb2.BulkRequest(
                namespace=self.namespace,
                filter=filters.filter_to_pb(where),
                dry_run=dry_run,
                max_tasks=min(left, MAX_BULK_TASKS),
                page_token=token,
            )
            answer = filters.outcome_from_pb(await self._call(method, req, retry=True))
            total += answer.count
            token = answer.next_token
            if not answer.more:
                return BulkOutcome(total, "", dry_run)


def _pairs(labels: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((labels or {}).items()))
