"""gRPC servicer of workers: claims, heartbeats, acks (single, batched and on the ``Work``
stream), failures and releases. No SQL here; what the servicers share is
``chronoq.node.edge.service._Servicer``."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

from chronoq import tracing
from chronoq.api import convert
from chronoq.api.v1 import (
    tasks_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from chronoq.effects import freed, freed_by_acks, of_tasks, released
from chronoq.errors import (
    ChronoqError,
    InvalidArgument,
    StaleLease,
    TaskNotFound,
)
from chronoq.limits import (
    MAX_CLAIM_TASKS,
    MAX_LEASES_PER_CALL,
    MAX_QUEUES_PER_CLAIM,
    MAX_WORKER_ID,
    check_count,
    check_name,
    check_text,
    failure_message,
)
from chronoq.models import AckOutcome, Lease, LeaseMiss, Task, TaskState
from chronoq.node.dispatch.claims import Claims, FairLanes, claim_lanes
from chronoq.node.dispatch.gate import Gate
from chronoq.node.dispatch.handoff import HandOff
from chronoq.node.dispatch.readiness import LongPollSlots
from chronoq.node.dispatch.work_stream import Openings, WorkSession, opened
from chronoq.node.edge.service import Ctx, _Servicer
from chronoq.node.edge.status import translated
from chronoq.timeslice import converted

log = logging.getLogger("chronoq.node")


class WorkerService(_Servicer, worker_pb2_grpc.WorkerServiceServicer):
    def __init__(
        self,
        *args: Any,
        openings: Openings | None = None,
        handoff: HandOff | None = None,
        gate: Gate | None = None,
        **kwargs: Any,
    ) -> None:
        """``handoff`` and ``gate``: the node's, shared with its owner engine (default:
        this servicer's own)."""
        super().__init__(*args, **kwargs)
        self._rng = random.Random()
        settings = self._settings
        self.claims = Claims(
            self._store,
            self._clock,
            self._notifier,
            LongPollSlots(settings.long_polls_per_namespace, settings.long_polls_per_node),
            FairLanes(claim_lanes(settings.pool_size)),
            dispatch=self._dispatch.apply,
            gate=gate,
        )
        #: The streams fired tasks are handed to (see ``chronoq.node.dispatch.handoff``).
        self.handoff = handoff if handoff is not None else HandOff(self.claims.gated_keys)
        #: Streams that have not sent their open message yet (capped, with a deadline): the
        #: node's one ``Openings``, shared with its auth interceptor.
        self.openings = Openings() if openings is None else openings

    def _claim_args(
        self, request: worker_pb2.ClaimRequest, context: Ctx, field: str = ""
    ) -> tuple[str, list[str], str, int, timedelta]:
        """A claim request checked: namespace, queues, worker id, max tasks and wait.
        ``field`` prefixes the names in errors (``claim.`` when it rides on an ack)."""
        namespace = check_name(field + "namespace", convert.namespace_of(request.namespace))
        if not request.queues:
            raise InvalidArgument(field + "queues", "name at least one queue to claim from")
        check_count(field + "queues", len(request.queues), MAX_QUEUES_PER_CLAIM)
        queues = [check_name(field + "queues", q) for q in request.queues]
        max_tasks = request.max_tasks or 1
        if max_tasks > MAX_CLAIM_TASKS:
            raise InvalidArgument(
                field + "max_tasks", f"is {max_tasks}; the limit is {MAX_CLAIM_TASKS}"
            )
        check_text(field + "worker_id", request.worker_id, MAX_WORKER_ID)
        wait = (
            convert.from_duration(field + "wait", request.wait)
            if request.HasField("wait")
            else timedelta(0)
        )
        wait = min(wait, self._settings.max_claim_wait)
        worker_id = request.worker_id or (context.peer() or "unknown")
        return namespace, queues, worker_id, max_tasks, wait

    @translated
    async def Claim(
        self, request: worker_pb2.ClaimRequest, context: Ctx
    ) -> worker_pb2.ClaimResponse:
        namespace, queues, worker_id, max_tasks, wait = self._claim_args(request, context)
        tasks = await self.claims.claim(context, namespace, queues, worker_id, max_tasks, wait)
        tracing.claimed(tasks, worker_id)  # no-op unless tracing is on
        return worker_pb2.ClaimResponse(tasks=await converted(tasks, convert.task_to_pb))

    @translated
    async def Heartbeat(
        self, request: worker_pb2.HeartbeatRequest, context: Ctx
    ) -> worker_pb2.HeartbeatResponse:
        check_count("leases", len(request.leases), MAX_LEASES_PER_CALL)
        leases = [convert.lease_from_pb(pb) for pb in request.leases]
        outcomes = await self._store.heartbeat(
            convert.namespace_of(request.namespace), leases, self._clock.now()
        )
        return worker_pb2.HeartbeatResponse(
            results=[
                worker_pb2.HeartbeatResult(
                    task_id=o.task_id, ok=o.ok, cancelled=o.cancelled, error=o.error
                )
                for o in outcomes
            ]
        )

    @translated
    async def Complete(self, request: worker_pb2.CompleteRequest, context: Ctx) -> tasks_pb2.Task:
        """RUNNING → SUCCEEDED; sent again with the same lease token, the same answer (a
        worker retries an ack whose answer it did not get, possibly through another node)."""
        namespace = convert.namespace_of(request.namespace)
        lease = _lease(request)
        (outcome,) = await self._store.complete(namespace, [lease], self._clock.now())
        self._dispatch.apply(freed_by_acks(namespace, [outcome]))
        self._metrics.completed.inc(int(outcome.ok))
        if not outcome.ok:
            if outcome.reason is LeaseMiss.NO_TASK:
                raise TaskNotFound(lease.task_id, namespace)
            raise StaleLease(lease.task_id, lease.lease_token, outcome.error)
        return convert.task_to_pb(await self._store.get(lease.task_id, namespace))

    @translated
    async def CompleteBatch(
        self, request: worker_pb2.CompleteBatchRequest, context: Ctx
    ) -> worker_pb2.CompleteBatchResponse:
        check_count("leases", len(request.leases), MAX_LEASES_PER_CALL)
        namespace = convert.namespace_of(request.namespace)
        leases = [convert.lease_from_pb(pb) for pb in request.leases]
        claim = None
        if request.HasField("claim"):  # checked before anything is written
            claim = self._claim_args(request.claim, context, "claim.")
            if claim[0] != namespace:
                raise InvalidArgument("claim.namespace", "must be empty or the acks' namespace")
        # The riding claim runs beside the acks, not after them: the worker freed those slots
        # already, and one call then costs the longer of the two statements, not their sum.
        claiming = (
            asyncio.ensure_future(self._claim_after_ack(context, *claim[:4]))
            if claim is not None
            else None
        )
        try:
            outcomes = (
                await self._store.complete(namespace, leases, self._clock.now()) if leases else []
            )
        except BaseException:
            if claiming is not None:  # the caller gets an error, so not the tasks: give back
                claiming.add_done_callback(functools.partial(self._give_back, namespace))
            raise
        self._completed(namespace, outcomes)
        response = worker_pb2.CompleteBatchResponse(
            results=[
                worker_pb2.AckResult(task_id=o.task_id, ok=o.ok, error=o.error) for o in outcomes
            ]
        )
        if claiming is not None:
            tasks = await claiming
            tracing.claimed(tasks, claim[2] if claim else "")  # no-op unless tracing is on
            response.claimed.extend(await converted(tasks, convert.task_to_pb))
        return response

    def _completed(self, namespace: str, outcomes: Sequence[AckOutcome]) -> None:
        """Counted; the slots of concurrency keys the acks freed wake claims of their queues."""
        self._metrics.completed.inc(sum(1 for o in outcomes if o.ok))
        self._dispatch.apply(freed_by_acks(namespace, outcomes))

    def _give_back(self, namespace: str, claiming: asyncio.Future[list[Task]]) -> None:
        if not claiming.cancelled() and claiming.exception() is None:
            self.claims.give_back(namespace, claiming.result())

    async def _claim_after_ack(
        self, context: Ctx, namespace: str, queues: list[str], worker_id: str, max_tasks: int
    ) -> list[Task]:
        """The claim that rides on an ack: at once (no long-poll), and a failure of its own
        leaves the acks' answer intact (the worker's claim loop asks again)."""
        try:
            return await self.claims.claim(
                context, namespace, queues, worker_id, max_tasks, timedelta(0)
            )
        except ChronoqError as exc:
            log.warning("claim riding on an ack failed (acks answered): %s", exc)
            return []

    @translated
    async def Work(self, request_iterator: AsyncIterator[Any], context: Ctx) -> None:
        """The streaming worker protocol (see ``chronoq.node.dispatch.work_stream``)."""
        first = await self.openings.first(request_iterator)
        namespace, queues, worker_id = opened(first, context.peer() or "")
        session = WorkSession(
            self.claims,
            self._store,
            self._clock,
            context,
            context.write,
            namespace=namespace,
            queues=queues,
            worker_id=worker_id,
            on_completed=lambda outcomes: self._completed(namespace, outcomes),
            handoff=self.handoff,
        )
        await session.run(first, request_iterator)

    @translated
    async def Fail(self, request: worker_pb2.FailRequest, context: Ctx) -> tasks_pb2.Task:
        retry_after = (
            self._settings.limits.check_delay(
                "retry_after", convert.from_duration("retry_after", request.retry_after)
            )
            if request.HasField("retry_after")
            else None
        )
        now = self._clock.now()
        task = await self._store.fail(
            convert.namespace_of(request.namespace),
            _lease(request),
            failure_message(request.error),
            now,
            fatal=request.fatal,
            retry_after=retry_after,
            rng=self._rng,
        )
        self._metrics.failed.inc()
        if task.state is TaskState.DEAD:
            self._metrics.dead.inc()
        self._dispatch.apply(of_tasks([task]).merge(freed([task])), now)
        return convert.task_to_pb(task)

    @translated
    async def Release(self, request: worker_pb2.ReleaseRequest, context: Ctx) -> tasks_pb2.Task:
        task = await self._store.release(convert.namespace_of(request.namespace), _lease(request))
        self._dispatch.apply(released([task]))
        return convert.task_to_pb(task)


def _lease(request: Any) -> Lease:
    if not request.HasField("lease"):
        raise InvalidArgument("lease", "is required (task_id and lease_token)")
    return convert.lease_from_pb(request.lease)
