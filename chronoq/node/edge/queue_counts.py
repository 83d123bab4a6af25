"""The QueueCounts RPC: a namespace's counts by queue as the partition owners keep them,
checked, summed over the store's shards and answered with their freshness.

An answer is kept for ``ANSWER_FRESH_S`` and given again to the same question (namespace,
queues, label key), callers of a question being read wait for that read, and at most
``READS_AT_ONCE`` answers are read from the store at once on a node: a caller that asks in a
loop, or many at once, costs the store a read a second per question, not one per call (the
counts are seconds old anyway, and ``as_of`` says how old).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

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

#: Seconds an answer is given again to the same question.
ANSWER_FRESH_S = 1.0
#: Answers read from the store at once on a node (the others wait their turn).
READS_AT_ONCE = 4
#: Questions whose answers a node keeps (past it, the oldest half is dropped).
MAX_KEPT_ANSWERS = 1024

_Question = tuple[str, tuple[str, ...], str]


class Answers:
    """Answers QueueCounts requests (already authorised for their namespace)."""

    def __init__(self, store: Admin, clock: Clock, partitions: int) -> None:
        self._store = store
        self._clock = clock
        self._partitions = partitions
        self._reads = asyncio.Semaphore(READS_AT_ONCE)
        self._kept: dict[_Question, tuple[float, tasks_pb2.QueueCountsResponse]] = {}
        self._pending: dict[_Question, asyncio.Future[tasks_pb2.QueueCountsResponse]] = {}
        self.reads = 0  # answers read from the store

    async def answer(self, request: tasks_pb2.QueueCountsRequest) -> tasks_pb2.QueueCountsResponse:
        namespace = check_name("namespace", convert.namespace_of(request.namespace))
        check_count("queues", len(request.queues), MAX_COUNTS_QUEUES)
        named = tuple(sorted({check_name("queues", q) for q in request.queues}))
        if request.label_key:
            check_labels([(request.label_key, "")], "label_key")
        question = (namespace, named, request.label_key)
        kept = self._kept.get(question)
        if kept is not None and time.monotonic() - kept[0] < ANSWER_FRESH_S:
            return kept[1]
        pending = self._pending.get(question)
        if pending is not None:  # the same question is being read: share its answer
            return await asyncio.shield(pending)
        pending = asyncio.get_running_loop().create_future()
        self._pending[question] = pending
        try:
            async with self._reads:
                answer = await self._read(namespace, named, request.label_key)
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved here: no waiter may be left to read it
            raise
        finally:
            del self._pending[question]
        pending.set_result(answer)
        if len(self._kept) >= MAX_KEPT_ANSWERS:
            for old in sorted(self._kept, key=lambda k: self._kept[k][0])[: MAX_KEPT_ANSWERS // 2]:
                del self._kept[old]
        self._kept[question] = (time.monotonic(), answer)
        return answer

    async def _read(
        self, namespace: str, named: tuple[str, ...], label_key: str
    ) -> tasks_pb2.QueueCountsResponse:
        self.reads += 1
        queues = list(named) or None
        kept = await self._store.kept_counts(namespace, queues, max_queues=MAX_KEPT_QUEUES)
        answered = snapshot(
            kept,
            now=self._clock.now(),
            partitions=self._partitions,
            max_queues=MAX_KEPT_QUEUES,
            queues=named,
        )
        if label_key:
            rows, capped = await self._store.label_counts(
                namespace, label_key, queues, max_tasks=MAX_LABEL_COUNTED_TASKS
            )
            labels, cut = label_tallies(rows, MAX_LABEL_TALLIES)
            answered = dataclasses.replace(answered, labels=labels, labels_capped=capped or cut)
        return snapshot_to_pb(answered)
