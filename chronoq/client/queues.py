"""The queue settings calls of ``Client``: pause, resume and per-key limits of a queue."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from chronoq import errors
from chronoq.api.queue_settings import settings_from_pb
from chronoq.api.v1 import tasks_pb2
from chronoq.queue_settings import QueueResumed, QueueSettings


class QueueSettingCalls:
    """``set_queue``, ``pause_queue``, ``resume_queue``, ``queue_settings`` and
    ``list_queue_settings`` (a base of ``Client``, which provides ``_call``)."""

    namespace: str
    _call: Callable[..., Awaitable[Any]]

    async def set_queue(
        self,
        queue: str,
        *,
        max_running_per_key: int | None = None,
        max_starts_per_key: float | None = None,
    ) -> QueueSettings:
        """Limit ``queue`` per concurrency key, cluster-wide: at most ``max_running_per_key``
        tasks of one key RUNNING at once (0..10,000), at most ``max_starts_per_key`` of one
        key started per second (0..100,000). 0 removes a limit; None leaves it as it is."""
        req = tasks_pb2.SetQueueRequest(namespace=self.namespace, queue=queue)
        if max_running_per_key is not None:
            if not 0 <= max_running_per_key < 2**32:  # what the wire can carry; the node bounds it
                raise errors.BadRequest(
                    f"max_running_per_key: must be between 0 and 10000, got {max_running_per_key}"
                )
            req.max_running_per_key = max_running_per_key
        if max_starts_per_key is not None:
            req.max_starts_per_key = max_starts_per_key
        pb = await self._call(lambda n: n.tasks.SetQueue, req, retry=True)  # a set: repeatable
        return settings_from_pb(pb)

    async def pause_queue(self, queue: str) -> QueueSettings:
        """Pause ``queue`` cluster-wide: its due tasks still fire (READY, their lateness
        counted from run_at) but no worker gets them until ``resume_queue``."""
        req = tasks_pb2.QueueRef(namespace=self.namespace, queue=queue)
        return settings_from_pb(await self._call(lambda n: n.tasks.PauseQueue, req, retry=True))

    async def resume_queue(self, queue: str) -> QueueResumed:
        """End the pause of ``queue``: READY tasks whose misfire policy is SKIP and that
        waited past their grace are skipped (``skipped``), the others run."""
        req = tasks_pb2.QueueRef(namespace=self.namespace, queue=queue)
        resp = await self._call(lambda n: n.tasks.ResumeQueue, req, retry=True)
        return QueueResumed(settings_from_pb(resp.queue), resp.skipped)

    async def queue_settings(self, queue: str) -> QueueSettings:
        """The settings of ``queue`` (the defaults when it has none)."""
        req = tasks_pb2.QueueRef(namespace=self.namespace, queue=queue)
        return settings_from_pb(await self._call(lambda n: n.tasks.GetQueue, req, retry=True))

    async def list_queue_settings(self) -> list[QueueSettings]:
        """This namespace's queues with settings (paused or limited per key), by name."""
        req = tasks_pb2.ListQueuesRequest(namespace=self.namespace)
        resp = await self._call(lambda n: n.tasks.ListQueues, req, retry=True)
        return [settings_from_pb(pb) for pb in resp.queues]
