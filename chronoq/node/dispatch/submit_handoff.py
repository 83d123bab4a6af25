"""The submit's hand-off: a task due at once goes from its insert straight to a waiting stream.

Without it a task submitted due now takes two writes and a wake-up before a handler starts:
the insert (READY), a notice that wakes a waiting stream, and that stream's claim (READY →
RUNNING). When a worker stream of this node waits on the task's queue with a free credit and
room for the task, the insert itself leases the task to that stream's worker (RUNNING,
attempt 1, leased as a claim leases: ``submit_leased``), and the node pushes it once the
insert committed, before it answers the submit: one statement and one message from the submit
to the handler, as the wheel's hand-off does for fired tasks (``chronoq.node.dispatch.handoff``).

It obeys what a claim obeys:

- a gated queue (a dispatch limit, a pause, a limit per concurrency key:
  ``chronoq.node.dispatch.gate``) is never handed off, nor any queue before the node has read
  its gate; the insert refuses a queue whose settings gate it too (it goes READY), whatever
  this node's gate said;
- order: only a *quiet* queue is handed off, one on which a waiter of this node found nothing
  at its last claim and no notice woke it since (``ReadyNotifier.quiet``). With READY tasks
  waiting, claims take them in (priority, run_at) order and the new task waits its turn; a
  hand-off never overtakes a task of higher priority or an older one;
- fairness between namespaces: the hand-off runs no claim statement and takes no claim lane
  (``FairLanes``); its write is the submit's own, which each namespace's submit quota bounds,
  so it takes no turn from another namespace's claims (it frees the lane its claim would use).

What the insert leased reaches the stream or goes back: a push that fails (the stream ended,
or stalled) gives the task back READY without using an attempt (``Claims.give_back``); a
stream that closed before the settle gives it back the same way; an insert that did not lease
(a repeated idempotency key) frees the credit. A submit whose caller went away during the
insert still settles (the task was accepted). An insert of unknown outcome (the connection
failed mid-commit) leaves what it may have leased to its lease's expiry, as a claim of unknown
outcome does: the reaper makes it READY again, never lost.
"""

from __future__ import annotations

import asyncio
import functools
from datetime import datetime
from typing import Protocol

from chronoq import submit_keys, tracecontext
from chronoq.limits import TASK_FIXED_BYTES
from chronoq.models import OCTET_STREAM, SubmitOutcome, TaskSpec, TaskState
from chronoq.node.dispatch.handoff import HandOff, Single
from chronoq.node.dispatch.readiness import ReadyNotifier

#: What ``fired_by`` holds for a task made due by its submit.
FIRED_BY_SUBMIT = "submit"


class LeasingSubmits(Protocol):
    """What the hand-off needs of the store (``ByPlacement.submit_leased``)."""

    async def submit_leased(
        self, spec: TaskSpec, now: datetime, worker_id: str
    ) -> SubmitOutcome: ...


def spec_bytes(spec: TaskSpec) -> int:
    """What the task ``spec`` makes costs in a push, as ``chronoq.limits.task_bytes`` counts
    it, less its worker id (added per stream)."""
    return (
        len(spec.payload)
        + len(spec.namespace.encode())
        + len(spec.queue.encode())
        + len((spec.idempotency_key or "").encode())
        + len(FIRED_BY_SUBMIT)
        + (0 if spec.content_type == OCTET_STREAM else len(spec.content_type.encode()))
        + tracecontext.stored_bytes(spec.trace_context)
        + len((spec.concurrency_key or "").encode())
        + len((spec.unique_key or "").encode())
        + len((spec.debounce_key or "").encode())
        + tracecontext.stored_bytes(spec.labels)
        + TASK_FIXED_BYTES
    )


class SubmitHandOff:
    """Submits of tasks due at once, leased by their insert to a stream waiting here."""

    def __init__(self, store: LeasingSubmits, handoff: HandOff, notifier: ReadyNotifier) -> None:
        self._store = store
        self._handoff = handoff
        self._notifier = notifier
        #: Tasks leased by their submit's insert and handed to their stream (which pushes
        #: them, or gives them back when it cannot).
        self.handed_off = 0
        #: Inserts in flight, held until they settle.
        self._pending: set[asyncio.Future[SubmitOutcome]] = set()

    def stream_for(self, spec: TaskSpec, now: datetime) -> Single | None:
        """A stream for ``spec`` (its credit and bytes held), or None: not due at ``now``,
        its queue not quiet here, or no stream can take it (see the module's docstring). A
        task with a unique or debounce key is never handed off: its key decides first, and a
        debounce makes it due later (``chronoq.store.keyed``)."""
        if (
            spec.run_at > now
            or submit_keys.keyed(spec)
            or not self._notifier.quiet(spec.namespace, (spec.queue,))
        ):
            return None
        return self._handoff.take((spec.namespace, spec.queue), spec_bytes(spec))

    async def submit(self, spec: TaskSpec, now: datetime) -> SubmitOutcome | None:
        """Submit ``spec`` leased to a waiting stream and push it there; None (nothing
        written) when no stream can take it, for the caller to submit it as usual."""
        single = self.stream_for(spec, now)
        if single is None:
            return None
        return await self.submit_to(single, spec, now)

    async def submit_to(self, single: Single, spec: TaskSpec, now: datetime) -> SubmitOutcome:
        """Submit ``spec`` leased to the stream ``single`` holds (from ``stream_for``), then push
        it there, or give it back if that stream can no longer take it."""
        job = asyncio.ensure_future(self._store.submit_leased(spec, now, single.worker_id))
        # Settled by the insert's own end, not by the submitter: what it leased reaches its
        # stream or goes back even when the submitter goes away meanwhile (hence the shield),
        # and its push starts before the submit's answer is made and sent (the callback runs
        # before the submitter wakes up), so the handler does not wait for that answer.
        self._pending.add(job)
        job.add_done_callback(functools.partial(self._settled, single))
        return await asyncio.shield(job)

    def _settled(self, single: Single, job: asyncio.Future[SubmitOutcome]) -> None:
        """The insert ended: push what it leased when it committed; free the credit when it
        leased nothing or failed (see the module's docstring)."""
        self._pending.discard(job)
        if job.cancelled() or job.exception() is not None:
            single.settle(None)
            return
        outcome = job.result()
        task = outcome.task
        leased = outcome.created and task.state is TaskState.RUNNING
        if single.settle(task if leased else None):
            self.handed_off += 1
