"""The client's QueueCounts call: a namespace's counts by queue, as the owners keep them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from chronoq.api.queue_counts import snapshot_from_pb
from chronoq.api.v1 import tasks_pb2
from chronoq.queuecounts import QueueSnapshot


class QueueCountCalls:
    """``Client.queue_counts`` (a base of ``Client``, which provides ``_call``)."""

    namespace: str
    _call: Callable[..., Awaitable[Any]]

    async def queue_counts(
        self, queues: Sequence[str] = (), *, label_key: str | None = None
    ) -> QueueSnapshot:
        """This namespace's tasks by queue and state (scheduled, ready, running, dead) and
        each queue's oldest READY task, summed from the counts the partition owners keep:
        cheap whatever the backlog, and as fresh as ``as_of`` says (a few seconds normally).

        Args:
            queues: these queues only (at most 100); empty: every queue (the first 1,000 in
                queue order, the rest summed in ``other``).
            label_key: also count per value of this label (read from the tasks up to a
                bound: ``labels_capped`` says when they are lower bounds).
        """
        req = tasks_pb2.QueueCountsRequest(
            namespace=self.namespace, queues=list(queues), label_key=label_key or ""
        )
        resp = await self._call(lambda n: n.tasks.QueueCounts, req, retry=True)
        return snapshot_from_pb(resp)
