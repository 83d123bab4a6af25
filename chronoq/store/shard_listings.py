"""The store of shards for operators: listings keyset over every shard, counts summed,
fences concatenated, requeue all or none per shard (``chronoq.store.sharded``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

from chronoq import errors, queuecounts
from chronoq.errors import (
    ChronoqError,
    InvalidArgument,
    RequeuePartlyDone,
    StoreUnavailable,
)
from chronoq.limits import task_bytes
from chronoq.models import Page, QueueCounts, Task, TaskState
from chronoq.queuecounts import KeptCounts
from chronoq.store import fanout
from chronoq.store.rows import Fence
from chronoq.store.shard_ids import ByTaskId
from chronoq.store.shard_routing import Route
from chronoq.store.tasks import PAGE_BYTES


class ShardListings(ByTaskId):
    """Admin calls that fan out over every shard."""

    async def requeue(self, namespace: str, ids: Sequence[str], now: datetime) -> list[Task]:
        """All or none per shard (one transaction each). Over several shards every id is
        read first, so a request naming one task that is not dead requeues nothing; then
        each shard requeues its part concurrently. A shard that fails after others
        committed (an outage, or a race that changed one of its tasks) raises
        ``RequeuePartlyDone`` naming the ids requeued; the rest were not, or their outcome is
        unknown (their shard did not answer)."""
        first = await self._straight(lambda solo: solo.requeue(namespace, ids, now))
        if not isinstance(first, Route):
            return first
        if not ids:
            raise InvalidArgument("ids", "name at least one dead task")
        m = self._routing()
        groups = fanout.grouped([self._id_partition(i) for i in ids], m.shard_of)

        async def requeue_part(mine: list[str]) -> list[Task]:
            answers = await self._routed(
                mine,
                self._id_partition,
                lambda s, pos: s.requeue(namespace, [mine[i] for i in pos], now),
                retry=first.retry,
            )
            return [t for _pos, tasks in answers for t in tasks]

        if len(groups) == 1:
            return await requeue_part(list(ids))
        for task_id in ids:
            try:
                task = await self.get(task_id, namespace)
            except errors.TaskNotFound:
                task = None
            if task is None or task.state is not TaskState.DEAD:
                raise InvalidArgument(
                    "ids", f"task {task_id} is not DEAD (or does not exist); nothing was requeued"
                )
        names = list(groups)
        results = await asyncio.gather(
            *(requeue_part([ids[i] for i in groups[n]]) for n in names), return_exceptions=True
        )
        done = [t for r in results if not isinstance(r, BaseException) for t in r]
        failed = [
            (n, r) for n, r in zip(names, results, strict=True) if isinstance(r, BaseException)
        ]
        if not failed:
            return done
        if not done or not all(isinstance(r, ChronoqError) for _n, r in failed):
            raise failed[0][1]
        raise RequeuePartlyDone(
            tuple(t.id for t in done), len(ids), tuple(n for n, _r in failed), str(failed[0][1])
        ) from failed[0][1]

    async def list_tasks(
        self,
        namespace: str,
        *,
        queue: str | None = None,
        state: TaskState | None = None,
        page_size: int = 100,
        page_token: str = "",
        max_bytes: int = PAGE_BYTES,
        labels: tuple[tuple[str, str], ...] = (),
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
    ) -> Page:
        """Every shard's page after the token, merged by id (a down shard fails the page:
        its token would walk past that shard's rows)."""
        if (solo := self._fast()) is not None:
            return await solo.list_tasks(
                namespace,
                queue=queue,
                state=state,
                page_size=page_size,
                page_token=page_token,
                max_bytes=max_bytes,
                labels=labels,
                run_at_from=run_at_from,
                run_at_to=run_at_to,
            )
        pages = await self._every(
            lambda s: s.list_tasks(
                namespace,
                queue=queue,
                state=state,
                page_size=page_size,
                page_token=page_token,
                max_bytes=max_bytes,
                labels=labels,
                run_at_from=run_at_from,
                run_at_to=run_at_to,
            ),
            skip_down=False,
        )
        return fanout.page(list(pages.values()), page_size, max_bytes, task_bytes)

    async def queue_counts(
        self, namespace: str, states: Sequence[TaskState], *, max_tasks: int, max_queues: int
    ) -> QueueCounts:
        if (solo := self._fast()) is not None:
            return await solo.queue_counts(
                namespace, states, max_tasks=max_tasks, max_queues=max_queues
            )
        answers = await self._every(
            lambda s: s.queue_counts(namespace, states, max_tasks=max_tasks, max_queues=max_queues)
        )
        return fanout.queue_counts(answers.values(), max_queues)

    async def count_by_state(self) -> dict[TaskState, int]:
        if (solo := self._fast()) is not None:
            return await solo.count_by_state()
        return fanout.summed((await self._every(lambda s: s.count_by_state())).values())

    async def kept_counts(
        self, namespace: str, queues: Sequence[str] | None, *, max_queues: int
    ) -> KeptCounts:
        """Every shard's kept counts merged (a shard down: its partitions uncounted)."""
        if (solo := self._fast()) is not None:
            return await solo.kept_counts(namespace, queues, max_queues=max_queues)
        answers = await self._every(
            lambda s: s.kept_counts(namespace, queues, max_queues=max_queues)
        )
        return queuecounts.merged(answers.values())

    async def label_counts(
        self, namespace: str, label_key: str, queues: Sequence[str] | None, *, max_tasks: int
    ) -> tuple[list[tuple[str, str, TaskState, int]], bool]:
        if (solo := self._fast()) is not None:
            return await solo.label_counts(namespace, label_key, queues, max_tasks=max_tasks)
        answers = await self._every(
            lambda s: s.label_counts(namespace, label_key, queues, max_tasks=max_tasks)
        )
        rows = [row for part, _capped in answers.values() for row in part]
        return rows, any(capped for _part, capped in answers.values())

    async def kept_ready(self) -> dict[tuple[str, str], int]:
        if (solo := self._fast()) is not None:
            return await solo.kept_ready()
        return fanout.summed((await self._every(lambda s: s.kept_ready())).values())

    async def oldest_ready(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], datetime]:
        if (solo := self._fast()) is not None:
            return await solo.oldest_ready(keys)
        out: dict[tuple[str, str], datetime] = {}
        for answer in (await self._every(lambda s: s.oldest_ready(keys))).values():
            for key, at in answer.items():
                if key not in out or at < out[key]:
                    out[key] = at
        return out

    async def count_by_state_per_shard(self) -> dict[str, dict[TaskState, int] | None]:
        """Each shard's counts (None: down), for a status that shows every shard."""
        answers = await asyncio.gather(
            *(self._on(n, lambda s: s.count_by_state()) for n in self._stores),
            return_exceptions=True,
        )
        out: dict[str, dict[TaskState, int] | None] = {}
        for name, answer in zip(self._stores, answers, strict=True):
            if isinstance(answer, StoreUnavailable):
                out[name] = None
            elif isinstance(answer, BaseException):
                raise answer
            else:
                out[name] = answer
        return out

    async def fences(self) -> list[Fence]:
        """Each partition's fence from the shard the map places it on."""
        if (solo := self._fast()) is not None:
            return await solo.fences()
        m = self._routing()
        answers = await self._every(lambda s: s.fences())
        out = [
            f
            for shard, fences in answers.items()
            for f in fences
            if 0 <= f.partition < m.partitions and m.shard_of(f.partition) == shard
        ]
        out.sort(key=lambda f: f.partition)
        return out
