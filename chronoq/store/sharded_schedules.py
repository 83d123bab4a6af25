"""Schedules over a store of shards (``chronoq.store.sharded``): each addressed by its
key's partition, materialised per shard, a namespace's cap and quota counted on the
map's first shard.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from chronoq.errors import (
    ChronoqError,
    NamespaceCapReached,
    PartitionMoved,
    ScheduleQuotaExceeded,
    ShardUnavailable,
    StoreUnavailable,
)
from chronoq.models import Schedule, ScheduleSpec
from chronoq.ratelimit import schedule_rate
from chronoq.routing import key_partition
from chronoq.store.counts import NamespaceCounts, Taken, shard_count
from chronoq.store.schedules import Charge, Materialized, Schedules, check_spec
from chronoq.store.shard_routing import ShardRouting
from chronoq.store.store import Store

log = logging.getLogger("chronoq.store")

#: The most namespaces one pass of ``ShardedSchedules.recount_due`` recounts (each one
#: statement per shard, its counter's row held meanwhile).
RECOUNT_BATCH = 100

R = TypeVar("R")


class _NotResumed(ChronoqError):
    """A resume over shards found its schedule paused again: its take goes back."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        super().__init__(f"schedule {schedule.spec.name!r} is paused")


class ShardedSchedules:
    """Schedules over a store of shards: each addressed by ``key_partition(namespace,
    name)``, materialised per shard of the owned partitions.

    While the map names more than one shard, a namespace's cap and quota are counted on
    the map's first shard (``chronoq.store.counts``): a create takes its place there before
    it writes on its own shard, so creates racing on several shards and nodes meet on one
    row lock. With one shard, the inserting statement counts the rows itself, as always."""

    def __init__(self, store: ShardRouting, *, lookahead: timedelta = timedelta(seconds=60)):
        self.store = store
        self.lookahead = lookahead
        self._of: dict[str, Schedules] = {}
        self._counters: NamespaceCounts | None = None

    def _schedules(self, shard: str) -> Schedules:
        store = self.store._store(shard)
        s = self._of.get(shard)
        if s is None or s.store is not store:
            s = self._of[shard] = Schedules(store, lookahead=self.lookahead)
        return s

    async def _at(self, shard: str, call: Callable[[Schedules], Awaitable[R]]) -> R:
        """``call`` on one shard's schedules; its outage named."""
        return await self.store._on(shard, lambda _s: call(self._schedules(shard)))

    def _shard(self, namespace: str, name: str) -> str:
        m = self.store.map
        return m.shard_of(key_partition(namespace, name, m.partitions))

    async def _on(self, namespace: str, name: str, call: Callable[[Schedules], Awaitable[R]]) -> R:
        try:
            return await self._at(self._shard(namespace, name), call)
        except PartitionMoved:
            await self.store._refreshed()
            return await self._at(self._shard(namespace, name), call)

    # ------------------------------------------------------------------ namespace counters

    def _counted(self) -> bool:
        """Whether the namespace counters are in use: from the map's second shard on (a
        shard is never removed from the map, so a cluster never goes back to not counting)."""
        return len(self.store.map.shards) > 1

    async def _count(self, call: Callable[[NamespaceCounts], Awaitable[R]]) -> R:
        """``call`` on the counters of the map's first shard; its outage named."""
        first = self.store.map.shards[0]

        def counters(store: Store) -> NamespaceCounts:
            c = self._counters
            if c is None or c.store is not store:
                c = self._counters = NamespaceCounts(store)
            return c

        return await self.store._on(first, lambda s: call(counters(s)))

    async def count_all(self, namespace: str) -> tuple[int, float]:
        """The namespace's schedules and reserved tasks/s over every shard the map names
        (each its own statement; a row that a move has copied counts twice: more, never
        fewer). Raises ``ShardUnavailable`` when one does not answer."""
        m = self.store.map
        answers = await asyncio.gather(
            *(self.store._on(shard, lambda s: shard_count(s, namespace)) for shard in m.shards),
            return_exceptions=True,
        )
        counts: list[tuple[int, float]] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            counts.append(answer)
        return sum(n for n, _r in counts), sum(r for _n, r in counts)

    async def _take(
        self,
        namespace: str,
        schedules: int,
        rate: float,
        now: datetime,
        *,
        cap: int | None,
        quota: float | None,
    ) -> uuid.UUID:
        """Take ``schedules`` and ``rate`` from the namespace's counter (seeded by a count
        over every shard when it has none), or refuse as the cap or the quota says."""

        def taking(c: NamespaceCounts) -> Awaitable[Taken | None]:
            return c.take(namespace, schedules, rate, now, cap=cap, quota=quota)

        taken = await self._count(taking)
        if taken is None:
            counted = await self.count_all(namespace)
            await self._count(lambda c: c.seed(namespace, *counted, now))
            taken = await self._count(taking)
        if taken is None:  # a counter row is never deleted: only a store that lost it
            raise ShardUnavailable(self.store.map.shards[0], "no namespace counter; retry")
        if taken.token is not None:
            return taken.token
        if cap is not None and schedules and taken.schedules + schedules > cap:
            raise NamespaceCapReached(namespace, "schedules", cap)
        if quota is not None:
            raise ScheduleQuotaExceeded(namespace, taken.reserved, rate, quota)
        raise NamespaceCapReached(namespace, "schedules", cap or 0)

    async def _settle(self, namespace: str, token: uuid.UUID, *, kept: bool) -> None:
        """The write that took ``token`` ended: its counts stay (``kept``) or go back. Not
        said (the first shard down): the take stays, over-counting until a recount."""
        try:
            if kept:
                await self._count(lambda c: c.drop(token))
            else:
                await self._count(lambda c: c.give_back(namespace, token))
        except StoreUnavailable as exc:
            log.warning("namespace %r: a take stays counted until a recount (%s)", namespace, exc)

    async def _taken_for(
        self, namespace: str, token: uuid.UUID, write: Callable[[], Awaitable[R]]
    ) -> R:
        """``write`` under a take: given back when it was refused (a refusal of the
        store, including a partition still moved after the retry), kept when it succeeded
        or its outcome is unknown (an outage or a cancellation: over-counts, never under)."""
        try:
            done = await write()
        except PartitionMoved:
            await self._settle(namespace, token, kept=False)
            raise
        except StoreUnavailable:
            raise
        except ChronoqError:
            await self._settle(namespace, token, kept=False)
            raise
        await self._settle(namespace, token, kept=True)
        return done

    async def _epoch(self, namespace: str) -> int | None:
        """The counter's epoch before a delete or pause (None: no counter, or the first
        shard down: then nothing is released and the count stays high until a recount)."""
        try:
            return await self._count(lambda c: c.epoch(namespace))
        except StoreUnavailable as exc:
            log.warning("namespace %r: its counter is not read (%s)", namespace, exc)
            return None

    async def _release(
        self, namespace: str, schedules: int, rate: float, epoch: int | None
    ) -> None:
        """A delete or pause committed: give back what it held (unless a recount ran since
        ``epoch``; none when it was not read: the count stays high until a recount)."""
        if epoch is None or (not schedules and not rate):
            return
        try:
            await self._count(lambda c: c.release(namespace, schedules, rate, epoch))
        except StoreUnavailable as exc:
            log.warning("namespace %r: a release waits for a recount (%s)", namespace, exc)

    async def recount(self, namespace: str, now: datetime) -> bool:
        """Set the namespace's counter to its schedules over every shard, settling the takes
        left by creates whose outcome was unknown; False when it did not (no counter yet,
        a take younger than ``counts.STALE`` in flight, a shard down, or the map changed
        while it counted: a row in flight between two shards could have been missed)."""
        version = self.store.map.version

        async def counted() -> tuple[int, float] | None:
            try:
                found = await self.count_all(namespace)
            except StoreUnavailable as exc:
                log.info("namespace %r: recount skipped (%s)", namespace, exc)
                return None
            return found if self.store.map.version == version else None

        return await self._count(lambda c: c.recount(namespace, now, counted))

    async def recount_due(self, now: datetime, *, limit: int = RECOUNT_BATCH) -> int:
        """One bounded pass: recount at most ``limit`` namespaces (those with a take left
        behind first, then those longest since a recount); how many were recounted. Nothing
        while the map names one shard."""
        if not self._counted():
            return 0
        done = 0
        for namespace in await self._count(lambda c: c.due(now, limit)):
            done += await self.recount(namespace, now)
        return done

    # ------------------------------------------------------------------ the port

    async def create(
        self,
        spec: ScheduleSpec,
        now: datetime,
        *,
        cap: int | None = None,
        quota: float | None = None,
    ) -> Schedule:
        if not self._counted():
            if (solo := self.store._fast()) is not None:
                return await Schedules(solo, lookahead=self.lookahead).create(
                    spec, now, cap=cap, quota=quota
                )
            return await self._on(
                spec.namespace, spec.name, lambda s: s.create(spec, now, cap=cap, quota=quota)
            )
        check_spec(spec)
        # Taken even with no cap and no quota: the counter must hold whatever a later,
        # capped create compares with.
        token = await self._take(
            spec.namespace, 1, schedule_rate(spec.rule), now, cap=cap, quota=quota
        )
        return await self._taken_for(
            spec.namespace,
            token,
            lambda: self._on(spec.namespace, spec.name, lambda s: s.create(spec, now)),
        )

    async def get(self, namespace: str, name: str) -> Schedule:
        return await self._on(namespace, name, lambda s: s.get(namespace, name))

    async def list_page(
        self, namespace: str, *, page_size: int = 100, after: str = ""
    ) -> list[Schedule]:
        if (solo := self.store._fast()) is not None:
            return await Schedules(solo).list_page(namespace, page_size=page_size, after=after)
        pages = await self.store._every(
            lambda s: Schedules(s).list_page(namespace, page_size=page_size, after=after),
            skip_down=False,
        )
        merged = sorted((x for p in pages.values() for x in p), key=lambda x: x.spec.name)
        return merged[:page_size]

    async def pause(self, namespace: str, name: str, now: datetime) -> Schedule:
        if not self._counted():
            return await self._on(namespace, name, lambda s: s.pause(namespace, name, now))
        epoch = await self._epoch(namespace)
        paused, changed = await self._on(
            namespace, name, lambda s: s.pause_once(namespace, name, now)
        )
        if changed:  # this call paused it: its rate is no longer reserved
            await self._release(namespace, 0, schedule_rate(paused.spec.rule), epoch)
        return paused

    async def resume(
        self, namespace: str, name: str, now: datetime, *, quota: float | None = None
    ) -> Schedule:
        if not self._counted():
            return await self._on(
                namespace, name, lambda s: s.resume(namespace, name, now, quota=quota)
            )
        current = await self.get(namespace, name)
        if not current.paused:
            return current
        token = await self._take(
            namespace, 0, schedule_rate(current.spec.rule), now, cap=None, quota=quota
        )

        async def resuming() -> Schedule:
            resumed = await self._on(namespace, name, lambda s: s.resume(namespace, name, now))
            if resumed.paused:  # paused again meanwhile: nothing of ours is reserved
                raise _NotResumed(resumed)
            return resumed  # (a racing resume also keeps its take: over-counts, never under)

        try:
            return await self._taken_for(namespace, token, resuming)
        except _NotResumed as still:
            return still.schedule

    async def delete(self, namespace: str, name: str, now: datetime) -> None:
        if not self._counted():
            return await self._on(namespace, name, lambda s: s.delete(namespace, name, now))
        epoch = await self._epoch(namespace)
        gone = await self._on(namespace, name, lambda s: s.remove(namespace, name, now))
        rate = 0.0 if gone.paused else schedule_rate(gone.spec.rule)
        await self._release(namespace, 1, rate, epoch)

    async def materialize(
        self,
        owned: Mapping[int, int],
        now: datetime,
        *,
        lookahead: timedelta = timedelta(seconds=60),
        batch: int = 100,
        per_schedule: int = 1000,
        charge: Charge | None = None,
        spent: Sequence[str] = (),
    ) -> Materialized:
        """Shard after shard (each pays from ``charge`` as it goes, so the quota holds)."""
        m = self.store.map
        groups: dict[str, dict[int, int]] = {}
        for p, token in owned.items():
            groups.setdefault(m.shard_of(p), {})[p] = token
        done = Materialized()

        def making(mine: dict[int, int]) -> Callable[[Schedules], Awaitable[Materialized]]:
            return lambda s: s.materialize(
                mine,
                now,
                lookahead=lookahead,
                batch=batch,
                per_schedule=per_schedule,
                charge=charge,
                spent=spent,
            )

        for shard, mine in groups.items():
            if len(groups) > 1 and self.store._failing(shard):
                continue  # its owner statements wait for its failure: the others first
            try:
                made = await self._at(shard, making(mine))
            except PartitionMoved:
                await self.store._refreshed()  # the rest of the moved ones: next pass
                continue
            except StoreUnavailable as exc:
                if len(groups) == 1:
                    raise
                self.store._skipped(shard, exc)
                continue
            done.add(made)
        return done
