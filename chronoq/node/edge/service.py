"""gRPC servicer of tasks: validate, convert, call the store, convert back. No SQL here (the
workers' servicer is ``worker_service``, the cluster's ``cluster_service``, the schedules'
``schedule_service``)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from datetime import datetime
from typing import Any

import grpc

from chronoq import tracing
from chronoq.api import convert, filters, spec_columns
from chronoq.api.spec_batch import SpecChecker
from chronoq.api.v1 import (
    tasks_pb2,
    tasks_pb2_grpc,
)
from chronoq.clock import Clock
from chronoq.config import NodeSettings
from chronoq.effects import freed, made_ready, of_submits
from chronoq.errors import (
    InvalidArgument,
    QuotaExceeded,
)
from chronoq.limits import (
    DEFAULT_PAGE_SIZE,
    MAX_COUNTED_QUEUES,
    MAX_COUNTED_TASKS,
    MAX_PAGE_SIZE,
    MAX_PAGE_TOKEN,
    MAX_QUEUE_BURST,
    MAX_QUEUE_RATE,
    MAX_REQUEUE_IDS,
    MAX_TASK_ID,
    check_count,
    check_full_answer,
    check_name,
    check_range,
    check_rate,
    check_text,
)
from chronoq.models import SubmitOutcome, TaskSpec, TaskState
from chronoq.node.dispatch.dispatcher import Dispatch
from chronoq.node.dispatch.gate import Gate
from chronoq.node.dispatch.readiness import ReadyNotifier
from chronoq.node.dispatch.submit_handoff import SubmitHandOff
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


def _required_id(task_id: str) -> str:
    if not task_id:
        raise InvalidArgument("id", "is required")
    return check_text("id", task_id, MAX_TASK_ID)
