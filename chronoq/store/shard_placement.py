"""The store of shards by placement: each submitted spec's partition computed here and
handed to its shard's store, one transaction per shard (``chronoq.store.sharded``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from chronoq import errors
from chronoq.effects import NO_EFFECTS, Effects
from chronoq.errors import BatchPartlyAccepted, InvalidArgument, PartitionMoved, StoreUnavailable
from chronoq.models import SubmitOutcome, Task, TaskSpec
from chronoq.routing import spec_routes, submit_partitions
from chronoq.store import fanout, legacy
from chronoq.store.rows import Accepted
from chronoq.store.shard_ids import ByTaskId
from chronoq.store.shard_routing import Route
from chronoq.store.store import Store

R = TypeVar("R")


def _check_storable(specs: Sequence[TaskSpec]) -> None:
    """Refuse before any shard writes what a shard would refuse in the middle of a batch
    (PostgreSQL text holds no NUL), so a refusal never leaves part of a batch written."""
    for s in specs:
        for field, value in (
            ("namespace", s.namespace),
            ("queue", s.queue),
            ("idempotency_key", s.idempotency_key or ""),
            ("content_type", s.content_type),
            ("concurrency_key", s.concurrency_key or ""),
            ("unique_key", s.unique_key or ""),
            ("debounce_key", s.debounce_key or ""),
            *(("labels", text) for pair in s.labels for text in pair),
        ):
            if "\x00" in value:
                raise InvalidArgument(field, "must not contain NUL characters")


def _claimed_before(head: tuple[int, datetime, int], spec: TaskSpec) -> bool:
    """Whether a READY task at ``head`` (priority, run_at, bytes) is claimed before ``spec``."""
    priority, run_at, _bytes = head
    return priority > spec.priority or (priority == spec.priority and run_at <= spec.run_at)


class Placement(ByTaskId):
    """Submits, placed and routed (a key of a task made before routing answers that task)."""

    async def _placed(
        self,
        specs: Sequence[TaskSpec],
        call: Callable[[Store, list[TaskSpec], list[int]], Awaitable[list[R]]],
        id_of: Callable[[R], tuple[str, bool]],
        *,
        retry: bool = True,
    ) -> list[R]:
        """One transaction per shard, concurrently, each spec placed here first; per spec
        its answer, in order. A shard failing after others committed: BatchPartlyAccepted.
        A group refused as moved is routed again once (``retry`` False: the caller did)."""
        _check_storable(specs)
        m = self._routing()
        parts = submit_partitions(spec_routes(specs), m.partitions)
        groups = fanout.grouped(parts, m.shard_of)
        names = list(groups)

        def run(name: str, pos: list[int]) -> Awaitable[list[R]]:
            return self._on(
                name, lambda s: call(s, [specs[i] for i in pos], [parts[i] for i in pos])
            )

        answers: list[Any] = list(
            await asyncio.gather(*(run(n, groups[n]) for n in names), return_exceptions=True)
        )
        moved = [i for i, a in enumerate(answers) if isinstance(a, PartitionMoved)]
        if moved and retry:
            await self._refreshed()
            m = self._routing()
            for i in moved:  # each refused group again, to its partitions' shards now
                again = fanout.grouped([parts[j] for j in groups[names[i]]], m.shard_of)
                try:
                    subs = await asyncio.gather(
                        *(
                            run(shard, [groups[names[i]][k] for k in ks])
                            for shard, ks in again.items()
                        )
                    )
                except StoreUnavailable as exc:
                    answers[i] = exc
                    continue
                merged = fanout.in_order(
                    len(groups[names[i]]),
                    [(ks, sub) for ks, sub in zip(again.values(), subs, strict=True)],
                )
                answers[i] = merged
        failed = [
            (n, a) for n, a in zip(names, answers, strict=True) if isinstance(a, BaseException)
        ]
        if failed:
            if len(failed) == len(names) or not all(
                isinstance(a, StoreUnavailable) for _n, a in failed
            ):
                raise failed[0][1]
            accepted = tuple(
                (i, *id_of(r))
                for n, a in zip(names, answers, strict=True)
                if not isinstance(a, BaseException)
                for i, r in zip(groups[n], a, strict=True)
            )
            raise BatchPartlyAccepted(
                tuple(sorted(accepted)), len(specs), tuple(n for n, _a in failed)
            ) from failed[0][1]
        return fanout.in_order(
            len(specs), [(groups[n], a) for n, a in zip(names, answers, strict=True)]
        )

    async def submit(self, specs: Sequence[TaskSpec], now: datetime) -> list[SubmitOutcome]:
        first = await self._straight(lambda solo: solo.submit(specs, now))
        if not isinstance(first, Route):
            return first
        if not specs:
            return []

        async def old(route: legacy.Route) -> SubmitOutcome | None:
            task = await self._old_task(route)
            return None if task is None else SubmitOutcome(task, False)

        return await self._placed(
            specs,
            lambda s, mine, parts: legacy.submit_routed(
                s, mine, parts, lambda m, p: s.submit(m, now, partitions=p), old
            ),
            lambda o: (o.task.id, o.created),
            retry=first.retry,
        )

    async def submit_leased(self, spec: TaskSpec, now: datetime, worker_id: str) -> SubmitOutcome:
        """Placed and routed as ``submit`` places one spec (a key of a task made before
        routing answers that task, not leased). Over several shards, each shard's head of
        the queue is read first, as a claim merges them: a READY task that a claim would
        take first, on any shard, makes this a plain submit (READY, waiting its turn)."""
        if spec.run_at > now:
            raise ValueError("only a task due at once is leased by its submit")
        first = await self._straight(lambda solo: solo.submit_leased(spec, now, worker_id))
        if not isinstance(first, Route):
            return first
        heads = await self._every(
            lambda s: s.ready_heads(spec.namespace, [spec.queue], 1, worker_id)
        )
        if any(h and _claimed_before(h[0], spec) for h in heads.values()):
            (outcome,) = await self.submit([spec], now)
            return outcome

        async def old(route: legacy.Route) -> SubmitOutcome | None:
            task = await self._old_task(route)
            return None if task is None else SubmitOutcome(task, False)

        async def leased(s: Store, mine: list[TaskSpec], parts: list[int]) -> list[SubmitOutcome]:
            return [await s.submit_leased(mine[0], now, worker_id, partition=parts[0])]

        (outcome,) = await self._placed(
            [spec],
            lambda s, mine, parts: legacy.submit_routed(
                s, mine, parts, lambda m, p: leased(s, m, p), old
            ),
            lambda o: (o.task.id, o.created),
            retry=first.retry,
        )
        return outcome

    async def _old_task(self, route: legacy.Route) -> Task | None:
        """The task made before routing that an entry names (None: it is gone)."""
        try:
            return await self.get(str(route.id), route.namespace)
        except errors.TaskNotFound:
            return None

    async def submit_ids(self, specs: Sequence[TaskSpec], now: datetime) -> Accepted:
        first = await self._straight(lambda solo: solo.submit_ids(specs, now))
        if not isinstance(first, Route):
            return first
        if not specs:
            return Accepted()

        # What each shard's part did, as that shard's store said (a debounce moves a task it
        # did not create; a debounced task's instant is not its spec's run_at).
        done: list[Effects] = []

        async def submit(
            s: Store, mine: list[TaskSpec], parts: list[int]
        ) -> list[tuple[str, bool]]:
            accepted = await s.submit_ids(mine, now, partitions=parts)
            done.append(accepted.effects)
            return list(accepted)

        async def old(route: legacy.Route) -> tuple[str, bool] | None:
            return None if await self._old_task(route) is None else (str(route.id), False)

        def ids(
            s: Store, mine: list[TaskSpec], parts: list[int]
        ) -> Awaitable[list[tuple[str, bool]]]:
            return legacy.submit_routed(s, mine, parts, lambda m, p: submit(s, m, p), old)

        answer = await self._placed(specs, ids, lambda pair: pair, retry=first.retry)
        return Accepted(answer, functools.reduce(Effects.merge, done, NO_EFFECTS))
