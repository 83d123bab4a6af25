"""The QueueCounts RPC: a namespace's counts by queue as the partition owners keep them,
checked, summed over the store's shards and answered with their freshness."""

from __future__ import annotations

import dataclasses

from chronoq.api import convert
from chronoq.api.queue_counts import snapshot_to_pb
from chronoq.api.v1 import tasks_pb2
from chronoq.clock import Clock
from chronoq.limits import (
    MAX_COUNTS_QUEUES,
    MAX_KEPT_QUEUES,
    MAX_LABEL_COUNTED_TASKS,
    MAX_LABEL_TALLIES,
    check_count,
    check_labels,
    check_name,
)
from chronoq.queuecounts import label_tallies, snapshot
from chronoq.store.port import Admin


async def answer(
    store: Admin, clock: Clock, partitions: int, request: tasks_pb2.QueueCountsRequest
) -> tasks_pb2.QueueCountsResponse:
    """The answer to ``request`` (already authorised for its namespace by the interceptor)."""
    namespace = check_name("namespace", convert.namespace_of(request.namespace))
    check_count("queues", len(request.queues), MAX_COUNTS_QUEUES)
    named = sorted({check_name("queues", q) for q in request.queues})
    if request.label_key:
        check_labels([(request.label_key, "")], "label_key")
    queues = named or None
    kept = await store.kept_counts(namespace, queues, max_queues=MAX_KEPT_QUEUES)
    answered = snapshot(
        kept, now=clock.now(), partitions=partitions, max_queues=MAX_KEPT_QUEUES, queues=named
    )
    if request.label_key:
        rows, capped = await store.label_counts(
            namespace, request.label_key, queues, max_tasks=MAX_LABEL_COUNTED_TASKS
        )
        labels, cut = label_tallies(rows, MAX_LABEL_TALLIES)
        answered = dataclasses.replace(answered, labels=labels, labels_capped=capped or cut)
    return snapshot_to_pb(answered)
