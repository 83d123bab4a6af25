"""The queue settings RPCs of ``TaskService``: pause, resume and per-key limits of a queue.

Each names its namespace in the request, so the auth interceptor holds it to the caller's
namespaces as it does ``SetQueueLimit``. A write holds on this node's dispatch gate at once
(``Gate.changed``) and in the store's statements on every node from its commit; a resume
wakes the claims waiting on the queue, here and (through the notices) on the other nodes.
"""

from __future__ import annotations

from typing import Any

import grpc

from chronoq.api import convert
from chronoq.api.queue_settings import settings_to_pb
from chronoq.api.v1 import tasks_pb2
from chronoq.clock import Clock
from chronoq.effects import made_ready
from chronoq.errors import InvalidArgument
from chronoq.limits import (
    MAX_QUEUE_SETTINGS_PER_NAMESPACE,
    MAX_RUNNING_PER_KEY,
    MAX_STARTS_PER_KEY,
    check_name,
    check_range,
    check_rate,
)
from chronoq.node.dispatch.dispatcher import Dispatch
from chronoq.node.dispatch.gate import Gate
from chronoq.node.edge.status import translated
from chronoq.node.metrics import NodeMetrics
from chronoq.store.port import TaskStore

Ctx = grpc.aio.ServicerContext[Any, Any]


def _queue_of(request: tasks_pb2.QueueRef | tasks_pb2.SetQueueRequest) -> tuple[str, str]:
    namespace = check_name("namespace", convert.namespace_of(request.namespace))
    return namespace, check_name("queue", request.queue)


class QueueRpcs:
    """SetQueue, PauseQueue, ResumeQueue, GetQueue and ListQueues (a part of ``TaskService``,
    which provides the store, the clock, the dispatcher, the metrics and the gate)."""

    _store: TaskStore
    _clock: Clock
    _dispatch: Dispatch
    _metrics: NodeMetrics
    gate: Gate

    @translated
    async def SetQueue(
        self, request: tasks_pb2.SetQueueRequest, context: Ctx
    ) -> tasks_pb2.QueueSettings:
        namespace, queue = _queue_of(request)
        running = starts = None
        if request.HasField("max_running_per_key"):
            running = check_range(
                "max_running_per_key", request.max_running_per_key, 0, MAX_RUNNING_PER_KEY
            )
        if request.HasField("max_starts_per_key"):
            starts = check_rate(
                "max_starts_per_key", request.max_starts_per_key, MAX_STARTS_PER_KEY
            )
        if running is None and starts is None:
            raise InvalidArgument(
                "max_running_per_key", "set it or max_starts_per_key (0 removes a limit)"
            )
        settings = await self._store.set_queue(
            namespace,
            queue,
            self._clock.now(),
            max_running_per_key=running,
            max_starts_per_key=starts,
            cap=MAX_QUEUE_SETTINGS_PER_NAMESPACE,
        )
        self.gate.changed(settings)
        return settings_to_pb(settings)

    @translated
    async def PauseQueue(
        self, request: tasks_pb2.QueueRef, context: Ctx
    ) -> tasks_pb2.QueueSettings:
        namespace, queue = _queue_of(request)
        settings = await self._store.pause_queue(
            namespace, queue, self._clock.now(), cap=MAX_QUEUE_SETTINGS_PER_NAMESPACE
        )
        self.gate.changed(settings)
        return settings_to_pb(settings)

    @translated
    async def ResumeQueue(
        self, request: tasks_pb2.QueueRef, context: Ctx
    ) -> tasks_pb2.ResumeQueueResponse:
        namespace, queue = _queue_of(request)
        resumed = await self._store.resume_queue(namespace, queue, self._clock.now())
        self.gate.changed(resumed.settings)
        self._metrics.skipped.inc(resumed.skipped)
        if resumed.ready:
            # Waiting claims of the queue, here and on the other nodes (the notice).
            self._dispatch.apply(made_ready({(namespace, queue): resumed.ready}))
        return tasks_pb2.ResumeQueueResponse(
            queue=settings_to_pb(resumed.settings), skipped=resumed.skipped
        )

    @translated
    async def GetQueue(self, request: tasks_pb2.QueueRef, context: Ctx) -> tasks_pb2.QueueSettings:
        namespace, queue = _queue_of(request)
        return settings_to_pb(await self._store.queue_settings(namespace, queue))

    @translated
    async def ListQueues(
        self, request: tasks_pb2.ListQueuesRequest, context: Ctx
    ) -> tasks_pb2.ListQueuesResponse:
        namespace = check_name("namespace", convert.namespace_of(request.namespace))
        found = await self._store.list_queue_settings(
            namespace, limit=MAX_QUEUE_SETTINGS_PER_NAMESPACE
        )
        return tasks_pb2.ListQueuesResponse(queues=[settings_to_pb(s) for s in found])
