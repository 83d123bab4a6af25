"""The store of shards by partition: owner statements, reads and retention over given
partitions, grouped by shard (``chronoq.store.sharded``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime

from chronoq.errors import StoreUnavailable
from chronoq.models import Task, TaskState
from chronoq.queuecounts import KEPT_STATES
from chronoq.store import fanout, legacy
from chronoq.store.rows import Fence, FireResult
from chronoq.store.shard_routing import DueSoon, Route, ShardRouting
from chronoq.store.store import Store

log = logging.getLogger("chronoq.store")


class ByPartition(ShardRouting):
    """Owner statements, reads and retention, each shard its partitions."""

    async def take_fences_local(self, partitions: Sequence[int], owner: str) -> dict[int, Fence]:
        if (solo := self._fast()) is not None:
            return await solo.take_fences_local(partitions, owner)
        ps = list(partitions)
        out: dict[int, Fence] = {}
        for _pos, fences in await self._routed(
            ps, int, lambda s, pos: s.take_fences_local([ps[i] for i in pos], owner)
        ):
            out.update(fences)
        return out

    async def take_fence(
        self, partition: int, token: int, cluster_id: str, owner: str
    ) -> Fence | None:
        ((_pos, fence),) = await self._routed(
            [partition], int, lambda s, _pos: s.take_fence(partition, token, cluster_id, owner)
        )
        return fence

    async def fences_of(self, partitions: Sequence[int]) -> dict[int, Fence | None]:
        """Each partition's fence from the shard holding it; a shard that is down is
        skipped, its partitions left out (the caller cannot tell absence from loss there)."""
        if (solo := self._fast()) is not None:
            return await solo.fences_of(partitions)
        ps = list(partitions)
        out: dict[int, Fence | None] = {}
        for _pos, fences in await self._routed(
            ps, int, lambda s, pos: s.fences_of([ps[i] for i in pos]), skip_down=True
        ):
            out.update(fences)
        return out

    async def fire_due(
        self, owned: Mapping[int, int], now: datetime, *, batch: int = 1000, node_id: str = ""
    ) -> FireResult:
        first = await self._straight(
            lambda solo: solo.fire_due(owned, now, batch=batch, node_id=node_id)
        )
        if not isinstance(first, Route):
            return first
        ps = list(owned)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.fire_due(
                {ps[i]: owned[ps[i]] for i in pos}, now, batch=batch, node_id=node_id
            ),
            skip_down=True,
            retry=first.retry,
        )
        return fanout.fire_results(r for _pos, r in answers)

    async def fire_listed(
        self,
        owned: Mapping[int, int],
        now: datetime,
        task_ids: Sequence[str],
        *,
        node_id: str = "",
        leases: Mapping[str, str] | None = None,
        budgets: Mapping[str, tuple[int, int]] | None = None,
    ) -> FireResult:
        first = await self._straight(
            lambda solo: solo.fire_listed(
                owned, now, task_ids, node_id=node_id, leases=leases, budgets=budgets
            )
        )
        if not isinstance(first, Route):
            return first
        ids = list(task_ids)

        def fire(s: Store, pos: list[int]) -> Awaitable[FireResult]:
            mine = [ids[i] for i in pos]
            parts = {self._id_partition(t) for t in mine}
            held = {p: tok for p, tok in owned.items() if p in parts}
            handed = None if leases is None else {t: leases[t] for t in mine if t in leases}
            return s.fire_listed(
                held, now, mine, node_id=node_id, leases=handed or None, budgets=budgets
            )

        answers = await self._routed(
            ids, self._id_partition, fire, skip_down=True, retry=first.retry
        )
        return fanout.fire_results(r for _pos, r in answers)

    async def advance_watermarks(self, owned: Mapping[int, int], bucket: int) -> set[int]:
        first = await self._straight(lambda solo: solo.advance_watermarks(owned, bucket))
        if not isinstance(first, Route):
            return first
        ps = list(owned)
        out: set[int] = set()
        for _pos, moved in await self._routed(
            ps,
            int,
            lambda s, pos: s.advance_watermarks({ps[i]: owned[ps[i]] for i in pos}, bucket),
            skip_down=True,
            retry=first.retry,
        ):
            out |= moved
        return out

    async def reap_expired(
        self,
        owned: Mapping[int, int],
        now: datetime,
        *,
        batch: int = 1000,
        rng: random.Random | None = None,
    ) -> list[Task]:
        first = await self._straight(
            lambda solo: solo.reap_expired(owned, now, batch=batch, rng=rng)
        )
        if not isinstance(first, Route):
            return first
        ps = list(owned)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.reap_expired(
                {ps[i]: owned[ps[i]] for i in pos}, now, batch=batch, rng=rng
            ),
            skip_down=True,
            retry=first.retry,
        )
        return [t for _pos, tasks in answers for t in tasks]

    async def due_soon(
        self,
        partitions: Sequence[int],
        after: datetime,
        until: datetime,
        *,
        limit: int,
        lanes: int = 64,
    ) -> list[DueSoon]:
        if (solo := self._fast()) is not None:
            return await solo.due_soon(partitions, after, until, limit=limit, lanes=lanes)
        ps = list(partitions)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.due_soon([ps[i] for i in pos], after, until, limit=limit, lanes=lanes),
            skip_down=True,
        )
        return fanout.earliest((r for _pos, r in answers), limit)

    async def pending_by_bucket(
        self,
        partitions: Sequence[int],
        first: int,
        last: int,
        *,
        due_after: datetime | None = None,
    ) -> dict[tuple[int, int], int]:
        if (solo := self._fast()) is not None:
            return await solo.pending_by_bucket(partitions, first, last, due_after=due_after)
        ps = list(partitions)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.pending_by_bucket(
                [ps[i] for i in pos], first, last, due_after=due_after
            ),
            skip_down=True,
        )
        return fanout.summed(r for _pos, r in answers)

    async def queue_depth(
        self, partitions: Sequence[int], first: int, last: int
    ) -> dict[tuple[str, str, str], int]:
        if (solo := self._fast()) is not None:
            return await solo.queue_depth(partitions, first, last)
        ps = list(partitions)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.queue_depth([ps[i] for i in pos], first, last),
            skip_down=True,
        )
        return fanout.summed(r for _pos, r in answers)

    async def recount_queues(
        self,
        partitions: Sequence[int],
        now: datetime,
        counter: str,
        *,
        max_queues: int,
        states: Sequence[TaskState] = KEPT_STATES,
    ) -> int:
        if (solo := self._fast()) is not None:
            return await solo.recount_queues(
                partitions, now, counter, max_queues=max_queues, states=states
            )
        ps = list(partitions)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.recount_queues(
                [ps[i] for i in pos], now, counter, max_queues=max_queues, states=states
            ),
            skip_down=True,
        )
        return sum(r for _pos, r in answers)

    async def purge_finished(
        self, partitions: Sequence[int], states: Sequence[TaskState], before: datetime, batch: int
    ) -> int:
        """Shard after shard, so that one call deletes at most ``batch`` rows in all."""
        m = self._routing()
        await legacy.sweep(self._stores, m.shard_of, partitions, self._route_sweeps)
        if (solo := self._fast()) is not None:
            return await solo.purge_finished(partitions, states, before, batch)
        groups = fanout.grouped(list(partitions), m.shard_of)
        left, total = batch, 0

        def purge(mine: list[int], most: int) -> Callable[[Store], Awaitable[int]]:
            return lambda s: s.purge_finished(mine, states, before, most)

        for shard, pos in groups.items():
            if left <= 0:
                break
            try:
                n = await self._on(shard, purge([partitions[i] for i in pos], left))
            except StoreUnavailable as exc:  # retention waits for the shard
                self._skipped(shard, exc)
                continue
            total += n
            left -= n
        return total
