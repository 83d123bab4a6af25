"""gRPC servicers of tasks and workers: validate, convert, call the store, convert back. No
SQL here (the cluster's is ``cluster_service``, the schedules' ``schedule_service``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import grpc

from chronoq import tracing
from chronoq.api import convert, filters, spec_columns
from chronoq.api.spec_batch import SpecChecker
from chronoq.api.v1 import (
    tasks_pb2,
    tasks_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from chronoq.clock import Clock
from chronoq.config import NodeSettings
from chronoq.effects import freed, freed_by_acks, made_ready, of_submits, of_tasks, released
from chronoq.errors import (
    ChronoqError,
    InvalidArgument,
    QuotaExceeded,
    StaleLease,
    TaskNotFound,
)
from chronoq.limits import (
    DEFAULT_PAGE_SIZE,
    MAX_CLAIM_TASKS,
    MAX_COUNTED_QUEUES,
    MAX_COUNTED_TASKS,
    MAX_LEASES_PER_CALL,
    MAX_PAGE_SIZE,
    MAX_PAGE_TOKEN,
    MAX_QUEUE_BURST,
    MAX_QUEUE_RATE,
    MAX_QUEUES_PER_CLAIM,
    MAX_REQUEUE_IDS,
    MAX_TASK_ID,
    MAX_WORKER_ID,
    check_count,
    check_full_answer,
    check_name,
    check_range,
    check_rate,
    check_text,
    failure_message,
)
from chronoq.models import AckOutcome, Lease, LeaseMiss, SubmitOutcome, Task, TaskSpec, TaskState
from chronoq.node.dispatch.claims import Claims, FairLanes, claim_lanes
from chronoq.node.dispatch.dispatcher import Dispatch
from chronoq.node.dispatch.gate import Gate
from chronoq.node.dispatch.handoff import HandOff
from chronoq.node.dispatch.readiness import LongPollSlots, ReadyNotifier
from chronoq.node.dispatch.submit_handoff import SubmitHandOff
from chronoq.node.dispatch.work_stream import Openings, WorkSession, opened
from chronoq.node.edge import queue_counts
from chronoq.node.edge.bulk import BulkSlots, bulk_call
from chronoq.node.edge.queue_service import QueueRpcs
from chronoq.node.edge.status import translated
from chronoq.node.metrics import NodeMetrics
from chronoq.ratelimit import Quotas
from chronoq.store.operator import COUNTABLE_STATES
from chronoq.store.port import TaskStore
from chronoq.taskfilter import BulkAction
from chronoq.timeslice import Timeslice, converted

Ctx = grpc.aio.ServicerContext[Any, Any]

#: Specs checked between two looks at the clock (a look costs about as much as a check).
CHECK_SLICE = 64

log = logging.getLogger("chronoq.node")


class _Servicer:
    """What the task and worker servicers share: the store, the clock, settings, the
    notifier that long-polling claims wait on, the node's metrics, and the dispatcher that
    applies what their writes did (default: one that wakes this notifier, no wheel)."""

    def __init__(
        self,
        store: TaskStore,
        clock: Clock,
        settings: NodeSettings,
        notifier: ReadyNotifier,
        metrics: NodeMetrics | None = None,
        *,
        dispatch: Dispatch | None = None,
    ) -> None:
        self._metrics = metrics or NodeMetrics(settings.node_id)
        self._store = store
        self._clock = clock
        self._settings = settings
        self._notifier = notifier
        self._dispatch = dispatch if dispatch is not None else Dispatch(notifier, clock)


def submit_quotas(settings: NodeSettings) -> Quotas | None:
    """The per-namespace submit buckets ``settings`` ask for (None: no quota)."""
    if not settings.submit_quota:
        return None
    return Quotas(
        settings.submit_quota, settings.submit_quota_burst or max(1.0, settings.submit_quota)
    )


class TaskService(_Servicer, QueueRpcs, tasks_pb2_grpc.TaskServiceServicer):
    def __init__(
        self,
        *args: Any,
        quotas: Quotas | None = None,
        handoff: SubmitHandOff | None = None,
        gate: Gate | None = None,
        **kwargs: Any,
    ) -> None:
        """``quotas``: the node's, shared with its schedule pump (default: its own).
        ``handoff``: leases a task due at once to a stream waiting on this node by its
        insert (None: every submit inserts READY and a claim takes it). ``gate``: the node's
        dispatch gate, which its queue settings RPCs change at once (default: its own)."""
        super().__init__(*args, **kwargs)
        self.gate = gate if gate is not None else Gate()
        self._quotas = quotas if quotas is not None else submit_quotas(self._settings)
        self.handoff = handoff
        #: Bulk calls running per namespace on this node (bounded).
        self.bulk_slots = BulkSlots()

    def _charge(self, specs: list[TaskSpec]) -> None:
        """Take each namespace's share from its submit quota, or refuse the whole request."""
        if self._quotas is None:
            return
        per_namespace = Counter(s.namespace for s in specs)
        now = asyncio.get_running_loop().time()
        for namespace, n in per_namespace.items():
            wait = self._quotas.take(namespace, n, now)
            if wait is not None:
                raise QuotaExceeded(namespace, self._quotas.rate, wait)

    async def _checked(self, specs: list[tasks_pb2.TaskSpec], now: datetime) -> list[TaskSpec]:
        check = SpecChecker(now, self._settings.defaults, self._settings.limits)
        checked = []
        timeslice = Timeslice()  # a full batch takes a few ms to check: others get turns
        for start in range(0, len(specs), CHECK_SLICE):
            await timeslice.pause_if_due()
            i = start
            try:
                for i in range(start, min(start + CHECK_SLICE, len(specs))):
                    checked.append(check(specs[i]))
            except InvalidArgument as exc:
                if len(specs) == 1:
                    raise
                problem = exc.message.split(": ", 1)[1]
                raise InvalidArgument(f"tasks[{i}].{exc.field}", problem) from None
        self._charge(checked)
        return checked

    async def _submit(self, specs: list[tasks_pb2.TaskSpec]) -> list[Any]:
        now = self._clock.now()
        outcomes = await self._store.submit(await self._checked(specs, now), now)
        self._metrics.submitted.inc(sum(1 for o in outcomes if o.created))
        self._dispatch.apply(of_submits(outcomes), now)
        return outcomes

    async def _submit_one(self, pb: tasks_pb2.TaskSpec) -> SubmitOutcome:
        """One task: handed off by its insert to a waiting stream when it can be (see
        ``chronoq.node.dispatch.submit_handoff``), else submitted as a batch of one."""
        if self.handoff is None:
            outcome: SubmitOutcome
            (outcome,) = await self._submit([pb])
            return outcome
        now = self._clock.now()
        (spec,) = await self._checked([pb], now)
        handed = await self.handoff.submit(spec, now)
        if handed is None:
            (handed,) = await self._store.submit([spec], now)
        self._metrics.submitted.inc(int(handed.created))
        self._dispatch.apply(of_submits([handed]), now)
        return handed

    @translated
    @tracing.node_submit
    async def Submit(
        self, request: tasks_pb2.SubmitRequest, context: Ctx
    ) -> tasks_pb2.SubmitResponse:
        if not request.HasField("task"):
            raise InvalidArgument("task", "is required")
        outcome = await self._submit_one(request.task)
        return tasks_pb2.SubmitResponse(
            task=convert.task_to_pb(outcome.task), created=outcome.created
        )

    @translated
    @tracing.node_submit
    async def SubmitBatch(
        self, request: tasks_pb2.SubmitBatchRequest, context: Ctx
    ) -> tasks_pb2.SubmitBatchResponse:
        if spec_columns.is_columnar(request):
            return await self._submit_columns(request)
        if not request.tasks:
            raise InvalidArgument("tasks", "must hold at least one task")
        if len(request.tasks) > self._settings.max_batch:
            raise InvalidArgument(
                "tasks",
                f"holds {len(request.tasks)} tasks; "
                f"the limit is {self._settings.max_batch} per batch",
            )
        if not request.ids_only:
            check_full_answer(request.ByteSize(), len(request.tasks))
        if request.ids_only:
            now = self._clock.now()
            return await self._submit_ids(await self._checked(list(request.tasks), now), now)
        outcomes = await self._submit(list(request.tasks))
        return tasks_pb2.SubmitBatchResponse(
            tasks=await converted(outcomes, lambda o: convert.task_to_pb(o.task)),
            created=[o.created for o in outcomes],
        )

    async def _submit_columns(
        self, request: tasks_pb2.SubmitBatchRequest
    ) -> tasks_pb2.SubmitBatchResponse:
        """The columnar form (``chronoq.api.spec_columns``), answered with ids."""
        count = spec_columns.check_shape(request, self._settings.max_batch)
        now = self._clock.now()
        check = SpecChecker(now, self._settings.defaults, self._settings.limits)
        specs: list[TaskSpec] = []
        timeslice = Timeslice()
        for part in spec_columns.column_specs(request, check, count):
            specs += part
            await timeslice.pause_if_due()
        self._charge(specs)
        return await self._submit_ids(specs, now)

    async def _submit_ids(
        self, specs: list[TaskSpec], now: datetime
    ) -> tasks_pb2.SubmitBatchResponse:
        accepted = await self._store.submit_ids(specs, now)
        self._metrics.submitted.inc(sum(1 for _i, created in accepted if created))
        self._dispatch.apply(accepted.effects, now)
        return tasks_pb2.SubmitBatchResponse(
            ids=[i for i, _c in accepted], created=[c for _i, c in accepted]
        )

    @translated
    async def GetTask(self, request: tasks_pb2.GetTaskRequest, context: Ctx) -> tasks_pb2.Task:
        task = await self._store.get(
            _required_id(request.id), convert.namespace_of(request.namespace)
        )
        return convert.task_to_pb(task)

    @translated
    async def CancelTask(
        self, request: tasks_pb2.CancelTaskRequest, context: Ctx
    ) -> tasks_pb2.Task:
        task = await self._store.cancel(
            _required_id(request.id), convert.namespace_of(request.namespace), self._clock.now()
        )
        self._dispatch.apply(freed([task]))  # a running task's key slot is free
        return convert.task_to_pb(task)

    async def _list(
        self, request: tasks_pb2.ListTasksRequest, state: TaskState | None
    ) -> tasks_pb2.ListTasksResponse:
        if request.queue:
            check_name("queue", request.queue)
        check_range("page_size", request.page_size, 0, MAX_PAGE_SIZE)
        check_text("page_token", request.page_token, MAX_PAGE_TOKEN)
        where = filters.list_filter(request, state)
        page = await self._store.list_tasks(
            check_name("namespace", convert.namespace_of(request.namespace)),
            queue=where.queue,
            state=state,
            page_size=request.page_size or DEFAULT_PAGE_SIZE,
            page_token=request.page_token,
            labels=where.labels,
            run_at_from=where.run_at_from,
            run_at_to=where.run_at_to,
        )
        return tasks_pb2.ListTasksResponse(
            tasks=await converted(page.tasks, convert.task_to_pb), next_page_token=page.next_token
        )

    @translated
    async def ListTasks(
        self, request: tasks_pb2.ListTasksRequest, context: Ctx
    ) -> tasks_pb2.ListTasksResponse:
        return await self._list(request, convert.state_from_pb(request.state))

    @translated
    async def ListDead(
        self, request: tasks_pb2.ListTasksRequest, context: Ctx
    ) -> tasks_pb2.ListTasksResponse:
        return await self._list(request, TaskState.DEAD)

    @translated
    async def SetQueueLimit(
        self, request: tasks_pb2.QueueLimit, context: Ctx
    ) -> tasks_pb2.QueueLimit:
        namespace = check_name("namespace", convert.namespace_of(request.namespace))
        queue = check_name("queue", request.queue)
        # NaN passes every comparison, and an infinite rate or burst is no limit: both refused.
        check_rate("rate", request.rate, MAX_QUEUE_RATE)
        check_rate("burst", request.burst, MAX_QUEUE_BURST)
        burst = request.burst or max(1.0, request.rate)
        if request.rate and burst < 1:
            raise InvalidArgument("burst", "must be at least 1 task")
        await self._store.set_queue_limit(
            namespace,
            queue,
            request.rate,
            burst,
            self._clock.now(),
            cap=self._settings.queue_limits_per_namespace,
        )
        return tasks_pb2.QueueLimit(
            namespace=namespace, queue=queue, rate=request.rate, burst=burst if request.rate else 0
        )

    @translated
    async def ListQueueLimits(
        self, request: tasks_pb2.ListQueueLimitsRequest, context: Ctx
    ) -> tasks_pb2.ListQueueLimitsResponse:
        namespace = convert.namespace_of(request.namespace)
        limits = await self._store.queue_limits()
        return tasks_pb2.ListQueueLimitsResponse(
            limits=[
                tasks_pb2.QueueLimit(namespace=ns, queue=q, rate=rate, burst=burst)
                for (ns, q), (rate, burst) in sorted(limits.items())
                if ns == namespace
            ]
        )

    @translated
    async def QueueCounts(
        self, request: tasks_pb2.QueueCountsRequest, context: Ctx
    ) -> tasks_pb2.QueueCountsResponse:
        return await self._queue_counts.answer(request)

    @functools.cached_property
    def _queue_counts(self) -> queue_counts.Answers:
        return queue_counts.Answers(self._store, self._clock, self._settings.partitions)

    @translated
    async def CountTasks(
        self, request: tasks_pb2.CountTasksRequest, context: Ctx
    ) -> tasks_pb2.CountTasksResponse:
        namespace = check_name("namespace", convert.namespace_of(request.namespace))
        check_count("states", len(request.states), len(TaskState))
        states = {convert.state_from_pb(s) for s in request.states}
        if None in states:
            raise InvalidArgument("states", "name states, not TASK_STATE_UNSPECIFIED")
        chosen = sorted(s for s in states if s is not None) or sorted(COUNTABLE_STATES)
        counts = await self._store.queue_counts(
            namespace, chosen, max_tasks=MAX_COUNTED_TASKS, max_queues=MAX_COUNTED_QUEUES
        )
        return convert.queue_counts_to_pb(counts)

    @translated
    async def Requeue(
        self, request: tasks_pb2.RequeueRequest, context: Ctx
    ) -> tasks_pb2.RequeueResponse:
        check_count("ids", len(request.ids), MAX_REQUEUE_IDS)
        ids = [check_text("ids", i, MAX_TASK_ID) for i in request.ids]
        tasks = await self._store.requeue(
            convert.namespace_of(request.namespace), ids, self._clock.now()
        )
        self._dispatch.apply(made_ready((t.namespace, t.queue) for t in tasks))
        return tasks_pb2.RequeueResponse(tasks=await converted(tasks, convert.task_to_pb))

    async def _bulk(
        self, action: BulkAction, request: tasks_pb2.BulkRequest, context: Ctx
    ) -> tasks_pb2.BulkResponse:
        return await bulk_call(
            action,
            request,
            context,
            store=self._store,
            clock=self._clock,
            dispatch=self._dispatch,
            slots=self.bulk_slots,
        )

    @translated
    async def CancelWhere(
        self, request: tasks_pb2.BulkRequest, context: Ctx
    ) -> tasks_pb2.BulkResponse:
        return await self._bulk(BulkAction.CANCEL, request, context)

    @translated
    async def RequeueWhere(
        self, request: tasks_pb2.BulkRequest, context: Ctx
    ) -> tasks_pb2.BulkResponse:
        return await self._bulk(BulkAction.REQUEUE, request, context)

    @translated
    async def RunNowWhere(
        self, request: tasks_pb2.BulkRequest, context: Ctx
    ) -> tasks_pb2.BulkResponse:
        return await self._bulk(BulkAction.RUN_NOW, request, context)


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


def _required_id(task_id: str) -> str:
    if not task_id:
        raise InvalidArgument("id", "is required")
    return check_text("id", task_id, MAX_TASK_ID)


def _lease(request: Any) -> Lease:
    if not request.HasField("lease"):
        raise InvalidArgument("lease", "is required (task_id and lease_token)")
    return convert.lease_from_pb(request.lease)
