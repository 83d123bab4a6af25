"""The store of shards by task id: a task's shard from its id, leases grouped by shard
(``chronoq.store.sharded``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from chronoq.models import AckOutcome, HeartbeatOutcome, Lease, Task
from chronoq.store import fanout
from chronoq.store.shard_routing import Route, ShardRouting
from chronoq.store.store import Store

R = TypeVar("R")


class ByTaskId(ShardRouting):
    """Reads and worker calls on the shard of each task."""

    async def get(self, task_id: str, namespace: str) -> Task:
        if (solo := self._fast()) is not None:
            return await solo.get(task_id, namespace)
        return await self._by_id(task_id, lambda s: s.get(task_id, namespace))

    async def cancel(self, task_id: str, namespace: str, now: datetime) -> Task:
        first = await self._straight(lambda solo: solo.cancel(task_id, namespace, now))
        if not isinstance(first, Route):
            return first
        return await self._by_id(
            task_id, lambda s: s.cancel(task_id, namespace, now), retry=first.retry
        )

    async def _by_leases(
        self,
        leases: Sequence[Lease],
        call: Callable[[Store, list[Lease]], Awaitable[list[R]]],
        *,
        retry: bool = True,
    ) -> list[R]:
        answers = await self._routed(
            [lease.task_id for lease in leases],
            self._id_partition,
            lambda s, pos: call(s, [leases[i] for i in pos]),
            retry=retry,
        )
        return fanout.in_order(len(leases), answers)

    async def heartbeat(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[HeartbeatOutcome]:
        first = await self._straight(lambda solo: solo.heartbeat(namespace, leases, now))
        if not isinstance(first, Route):
            return first
        return await self._by_leases(
            leases, lambda s, ls: s.heartbeat(namespace, ls, now), retry=first.retry
        )

    async def complete(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[AckOutcome]:
        first = await self._straight(lambda solo: solo.complete(namespace, leases, now))
        if not isinstance(first, Route):
            return first
        return await self._by_leases(
            leases, lambda s, ls: s.complete(namespace, ls, now), retry=first.retry
        )

    async def fail(
        self,
        namespace: str,
        lease: Lease,
        error: str,
        now: datetime,
        *,
        fatal: bool = False,
        retry_after: timedelta | None = None,
        rng: random.Random | None = None,
    ) -> Task:
        def call(s: Store) -> Awaitable[Task]:
            return s.fail(
                namespace, lease, error, now, fatal=fatal, retry_after=retry_after, rng=rng
            )

        first = await self._straight(call)
        if not isinstance(first, Route):
            return first
        return await self._by_id(lease.task_id, call, retry=first.retry)

    async def release(self, namespace: str, lease: Lease) -> Task:
        first = await self._straight(lambda solo: solo.release(namespace, lease))
        if not isinstance(first, Route):
            return first
        return await self._by_id(
            lease.task_id, lambda s: s.release(namespace, lease), retry=first.retry
        )

    async def release_handed(
        self, leases: Mapping[str, str], fired_at: datetime, now: datetime
    ) -> Counter[tuple[str, str]]:
        first = await self._straight(lambda solo: solo.release_handed(leases, fired_at, now))
        if not isinstance(first, Route):
            return first
        ids = list(leases)
        answers = await self._routed(
            ids,
            self._id_partition,
            lambda s, pos: s.release_handed({ids[i]: leases[ids[i]] for i in pos}, fired_at, now),
            retry=first.retry,
        )
        out: Counter[tuple[str, str]] = Counter()
        for _pos, given in answers:
            out.update(given)
        return out
