"""A task store of several shards behind the same port: each call goes where the shard map
says (``docs/design/shards.md``), and calls that span shards fan out and merge.

Routing, by port:

- **by partition** (owner statements, reads and retention over given partitions): the
  partitions grouped by ``map.shard_of(p)``, one statement per shard, concurrently, the
  answers merged (``chronoq.store.fanout``). Retention runs shard after shard, so one call
  deletes at most ``batch`` rows in all.
- **by task id**: ``routing.id_partition`` names the shard; lease and id lists are grouped.
- **by placement** (submits): each spec's partition is computed here
  (``routing.submit_partitions``) and handed to the shard's store, one transaction per shard,
  concurrently. Specs are checked for what a shard would refuse (NUL in text) before any
  shard writes; a shard that fails after others committed raises ``BatchPartlyAccepted``
  (UNAVAILABLE, "outcome unknown"): the SDK, which keys every task, repeats the whole batch.
  A key of a task made before routing is answered by that task (``chronoq.store.legacy``).
- **by queue**: a claim reads each shard's head of its queues first (at most ``max_tasks``
  READY tasks, unlocked), merges them into how many each shard claims (the best by
  priority and run_at within the byte budget), and each shard claims that many under a
  strict share of the budget: no task is leased that the answer does not keep, so no
  attempt is spent on a task no worker gets. While one shard alone held ready tasks of the
  queues at the last claim, it is claimed at once, the others' heads read beside it. Queue
  limits and their token buckets live on the map's first shard (``shard-0``, never removed
  and never a partition's move): one statement counts a namespace's limits against its
  cap, and every claim of a limited queue takes its tokens there, then claims on any shard
  and gives back what it did not use.
- **admin**: listings keyset by id over every shard (each shard's page after the token,
  merged, cut where the first shard's page ended); counts summed; fences concatenated.
- **notices**: announced on one shard (the first that answers), listened to on every shard.
- **reachability and clock**: ``probe`` is every shard, ``probe_shard(name)`` one;
  ``server_clock`` is the first shard's, ``server_clock_of(name)`` any shard's.

A down shard: a call that needs it alone raises ``ShardUnavailable`` naming it; reads,
counts and owner statements over several shards skip it (logged; a node's per-shard health
says which), unless every shard they need is down; a write that must reach it fails (a
submit with ``BatchPartlyAccepted`` when others committed). A listing does not skip a shard:
its page token would walk past that shard's rows for good.

``PartitionMoved`` (a shard that no longer holds a partition at the caller's map version):
``refresh()`` is awaited (at most ``REFRESH_S``), and the refused part of the call is routed
again under the new map, once; refused again, the error goes to the caller.

When one shard holds every partition, each call goes straight to its store: the single
deployment pays an attribute read and an identity check per call.

For the node (``node.py``): build ``ShardedStore({"shard-0": store, ...}, view.current,
refresh=view.refresh)``; call ``add_store`` when the map gains a shard (before routing to
it), ``set_map`` when the view delivers a new map (pushes its version into each store, which
passes it to the fenced writes); per-shard health from ``probe_shard``, the clock check per
shard through ``server_clock_of``. ``ShardedSchedules(sharded)`` replaces ``Schedules``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from chronoq import errors
from chronoq.errors import (
    BatchPartlyAccepted,
    ChronoqError,
    InvalidArgument,
    NamespaceCapReached,
    PartitionMoved,
    RequeuePartlyDone,
    ScheduleQuotaExceeded,
    ShardUnavailable,
    StoreUnavailable,
)
from chronoq.limits import MAX_ANSWER_BYTES, task_bytes
from chronoq.models import (
    AckOutcome,
    HeartbeatOutcome,
    Lease,
    Page,
    QueueCounts,
    Schedule,
    ScheduleSpec,
    SubmitOutcome,
    Task,
    TaskSpec,
    TaskState,
)
from chronoq.ratelimit import schedule_rate
from chronoq.routing import id_partition, key_partition, submit_partitions
from chronoq.shardmap import ShardMap
from chronoq.store import fanout, legacy
from chronoq.store.connection import Listener
from chronoq.store.counts import NamespaceCounts, Taken, shard_count
from chronoq.store.rows import Accepted, Fence, FireResult, parse_task_id
from chronoq.store.schedules import Charge, Materialized, Schedules, check_spec
from chronoq.store.store import Store
from chronoq.store.tasks import PAGE_BYTES

log = logging.getLogger("chronoq.store")

#: A task as the timing wheel holds it (``port.DueSoon``; the port imports this module).
DueSoon = tuple[str, int, datetime, str, str]
#: Seconds a call refused with ``PartitionMoved`` waits for the node's map to refresh.
REFRESH_S = 1.0
#: Seconds between two warnings about the same down shard skipped by a fan-out.
SKIP_WARN_S = 10.0
#: The most namespaces one pass of ``ShardedSchedules.recount_due`` recounts (each one
#: statement per shard, its counter's row held meanwhile).
RECOUNT_BATCH = 100
#: Claimed (namespace, queues) remembered as ready on one shard alone (forgotten all at once
#: past this).
SOLE_ENTRIES = 4096

R = TypeVar("R")
K = TypeVar("K")



def _check_storable(specs: Sequence[TaskSpec]) -> None:
    """Refuse before any shard writes what a shard would refuse in the middle of a batch
    (PostgreSQL text holds no NUL), so a refusal never leaves part of a batch written."""
    for s in specs:
        for field, value in (
            ("namespace", s.namespace),
            ("queue", s.queue),
            ("idempotency_key", s.idempotency_key or ""),
            ("content_type", s.content_type),
        ):
            if "\x00" in value:
                raise InvalidArgument(field, "must not contain NUL characters")


class _Listenings:
    """Listening on every shard: closed as soon as one of them is lost (or was not opened),
    so the caller opens all again."""

    def __init__(self, parts: Sequence[Listener], complete: bool) -> None:
        self._parts = parts
        self._complete = complete

    @property
    def closed(self) -> bool:
        return not self._complete or any(p.closed for p in self._parts)

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self._parts), return_exceptions=True)
        self._complete = False


def _claimed_before(head: tuple[int, datetime, int], spec: TaskSpec) -> bool:
    """Whether a READY task at ``head`` (priority, run_at, bytes) is claimed before ``spec``."""
    priority, run_at, _bytes = head
    return priority > spec.priority or (priority == spec.priority and run_at <= spec.run_at)


class ShardedStore:
    """The task store as shards (one ``Store`` per shard), routed by ``current_map()``.

    ``refresh``: makes ``current_map()`` answer the newest map (awaited after a
    ``PartitionMoved``, at most ``REFRESH_S``).
    """

    def __init__(
        self,
        stores: Mapping[str, Store],
        current_map: Callable[[], ShardMap],
        *,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        if not stores:
            raise ValueError("a store of shards needs at least one shard's store")
        self._stores: dict[str, Store] = dict(stores)
        self._current_map = current_map
        self._refresh = refresh
        self._seen: ShardMap | None = None
        self._solo: Store | None = None
        self._warned: dict[str, float] = {}
        #: (namespace, queues) whose last claim found ready tasks on one shard alone.
        self._sole: dict[tuple[str, tuple[str, ...]], str] = {}
        #: Per shard, where the retention of its legacy routes goes on (``legacy.sweep``).
        self._route_sweeps: dict[str, uuid.UUID] = {}
        self._routing()

    # ------------------------------------------------------------------ the map

    @property
    def stores(self) -> Mapping[str, Store]:
        """Each shard's store, by shard name."""
        return dict(self._stores)

    def add_store(self, name: str, store: Store) -> None:
        """Open routing to one more shard (before a map that places partitions there)."""
        self._stores[name] = store
        self._seen = None
        self._routing()

    def set_map(self, shard_map: ShardMap) -> None:
        """Route by ``shard_map`` from now on (``current_map`` should answer it too): each
        store passes its version with the fenced writes."""
        for store in self._stores.values():
            store.map_version = shard_map.version
        self._seen = None
        self._routing(shard_map)

    @property
    def map(self) -> ShardMap:
        """The map calls are routed by."""
        return self._routing()

    def _routing(self, shard_map: ShardMap | None = None) -> ShardMap:
        """The current map; the single store that holds all of it, when there is one."""
        m = self._current_map() if shard_map is None else shard_map
        if m is not self._seen:
            missing = sorted(set(m.placement) - set(self._stores))
            if missing:
                log.warning(
                    "shard map v%d places partitions on %s, which has no store yet",
                    m.version,
                    ", ".join(missing),
                )
            held = set(m.placement)
            only = next(iter(held)) if len(held) == 1 else None
            self._solo = self._stores.get(only) if only is not None else None
            self._seen = m
        return m

    def _store(self, shard: str) -> Store:
        store = self._stores.get(shard)
        if store is None:
            raise ShardUnavailable(shard, "this node has no connection to it yet; retry")
        return store

    @property
    def partitions(self) -> int:
        return self._routing().partitions

    @property
    def bucket_seconds(self) -> int:
        return next(iter(self._stores.values())).bucket_seconds

    async def _refreshed(self) -> None:
        if self._refresh is not None:
            try:
                await asyncio.wait_for(self._refresh(), REFRESH_S)
            except (TimeoutError, StoreUnavailable, errors.CoordinatorUnavailable) as exc:
                log.debug("shard map refresh after a moved partition failed: %s", exc)
        self._seen = None

    # ------------------------------------------------------------------ fan-out core

    async def _on(self, shard: str, call: Callable[[Store], Awaitable[R]]) -> R:
        """``call`` on one shard; its outage named."""
        store = self._store(shard)
        try:
            return await call(store)
        except PartitionMoved:
            raise
        except ShardUnavailable:
            raise
        except StoreUnavailable as exc:
            raise ShardUnavailable(shard, exc.message) from exc

    async def _routed(
        self,
        keys: Sequence[K],
        partition_of: Callable[[K], int],
        call: Callable[[Store, list[int]], Awaitable[R]],
        *,
        skip_down: bool = False,
        retry: bool = True,
    ) -> list[tuple[list[int], R]]:
        """``call(store, positions)`` once per shard holding some of ``keys`` (their
        positions), concurrently: (positions, answer) per shard that answered.

        A shard's ``PartitionMoved``: the map is refreshed and its positions are routed again,
        once. ``skip_down``: a shard that is down is left out (unless every one is); else
        the first failure is raised once all have ended (the others' writes committed)."""
        m = self._routing()
        parts = [partition_of(k) for k in keys]
        groups = fanout.grouped(parts, m.shard_of)
        names = list(groups)

        def bound(positions: list[int]) -> Callable[[Store], Awaitable[R]]:
            return lambda s: call(s, positions)

        answers = await asyncio.gather(
            *(self._on(n, bound(groups[n])) for n in names), return_exceptions=True
        )
        done: list[tuple[list[int], R]] = []
        moved: list[int] = []
        down: list[BaseException] = []
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, PartitionMoved) and retry:
                moved += groups[name]
            elif isinstance(answer, StoreUnavailable) and skip_down:
                down.append(answer)
                self._skipped(name, answer)
            elif isinstance(answer, BaseException):
                down.append(answer)
            else:
                done.append((groups[name], answer))
        if moved:
            await self._refreshed()
            again = await self._routed(
                [keys[i] for i in moved],
                partition_of,
                lambda s, ps: call(s, [moved[i] for i in ps]),
                skip_down=skip_down,
                retry=False,
            )
            done += [([moved[i] for i in ps], r) for ps, r in again]
        if down and (not skip_down or not done):
            raise down[0]
        return done

    def _skipped(self, shard: str, exc: BaseException) -> None:
        at = time.monotonic()
        if at - self._warned.get(shard, -SKIP_WARN_S) >= SKIP_WARN_S:
            self._warned[shard] = at
            log.warning("store %s skipped by a call over several shards: %s", shard, exc)

    async def _every(
        self, call: Callable[[Store], Awaitable[R]], *, skip_down: bool = True
    ) -> dict[str, R]:
        """``call`` on every shard the map names (holding partitions or not), concurrently."""
        m = self._routing()
        names = [s for s in m.shards if s in self._stores]
        answers = await asyncio.gather(*(self._on(n, call) for n in names), return_exceptions=True)
        out: dict[str, R] = {}
        down: list[BaseException] = []
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, StoreUnavailable) and skip_down:
                self._skipped(name, answer)
                down.append(answer)
            elif isinstance(answer, BaseException):
                down.append(answer)
            else:
                out[name] = answer
        if down and (not skip_down or not out):
            raise down[0]
        return out

    async def _by_id(
        self, task_id: str, call: Callable[[Store], Awaitable[R]], *, retry: bool = True
    ) -> R:
        """``call`` on the shard of one task (refreshed and routed again once if moved,
        unless the caller did that already: ``retry`` False)."""
        p = id_partition(parse_task_id(task_id), self._routing().partitions)
        try:
            return await self._on(self._routing().shard_of(p), call)
        except PartitionMoved:
            if not retry:
                raise
            await self._refreshed()
            return await self._on(self._routing().shard_of(p), call)

    def _id_partition(self, task_id: str) -> int:
        return id_partition(parse_task_id(task_id), self._routing().partitions)

    @property
    def _limits_shard(self) -> str:
        """Where queue limits and their tokens live: the map's first shard."""
        return self._routing().shards[0]

    # ------------------------------------------------------------------ by partition

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

    def _fast(self) -> Store | None:
        """The one store holding every partition of the current map, if one does."""
        self._routing()
        return self._solo

    async def fire_due(
        self, owned: Mapping[int, int], now: datetime, *, batch: int = 1000, node_id: str = ""
    ) -> FireResult:
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.fire_due(owned, now, batch=batch, node_id=node_id)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        ps = list(owned)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.fire_due(
                {ps[i]: owned[ps[i]] for i in pos}, now, batch=batch, node_id=node_id
            ),
            skip_down=True,
            retry=not retried,
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
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.fire_listed(
                    owned, now, task_ids, node_id=node_id, leases=leases, budgets=budgets
                )
            except PartitionMoved:
                await self._refreshed()
                retried = True
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
            ids, self._id_partition, fire, skip_down=True, retry=not retried
        )
        return fanout.fire_results(r for _pos, r in answers)

    async def advance_watermarks(self, owned: Mapping[int, int], bucket: int) -> set[int]:
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.advance_watermarks(owned, bucket)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        ps = list(owned)
        out: set[int] = set()
        for _pos, moved in await self._routed(
            ps,
            int,
            lambda s, pos: s.advance_watermarks({ps[i]: owned[ps[i]] for i in pos}, bucket),
            skip_down=True,
            retry=not retried,
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
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.reap_expired(owned, now, batch=batch, rng=rng)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        ps = list(owned)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.reap_expired(
                {ps[i]: owned[ps[i]] for i in pos}, now, batch=batch, rng=rng
            ),
            skip_down=True,
            retry=not retried,
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
        self, partitions: Sequence[int], first: int, last: int
    ) -> dict[tuple[int, int], int]:
        if (solo := self._fast()) is not None:
            return await solo.pending_by_bucket(partitions, first, last)
        ps = list(partitions)
        answers = await self._routed(
            ps,
            int,
            lambda s, pos: s.pending_by_bucket([ps[i] for i in pos], first, last),
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

    # ------------------------------------------------------------------ by task id

    async def get(self, task_id: str, namespace: str) -> Task:
        if (solo := self._fast()) is not None:
            return await solo.get(task_id, namespace)
        return await self._by_id(task_id, lambda s: s.get(task_id, namespace))

    async def cancel(self, task_id: str, namespace: str, now: datetime) -> Task:
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.cancel(task_id, namespace, now)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        return await self._by_id(
            task_id, lambda s: s.cancel(task_id, namespace, now), retry=not retried
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
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.heartbeat(namespace, leases, now)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        return await self._by_leases(
            leases, lambda s, ls: s.heartbeat(namespace, ls, now), retry=not retried
        )

    async def complete(
        self, namespace: str, leases: Sequence[Lease], now: datetime
    ) -> list[AckOutcome]:
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.complete(namespace, leases, now)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        return await self._by_leases(
            leases, lambda s, ls: s.complete(namespace, ls, now), retry=not retried
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

        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await call(solo)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        return await self._by_id(lease.task_id, call, retry=not retried)

    async def release(self, namespace: str, lease: Lease) -> Task:
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.release(namespace, lease)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        return await self._by_id(
            lease.task_id, lambda s: s.release(namespace, lease), retry=not retried
        )

    async def requeue(self, namespace: str, ids: Sequence[str], now: datetime) -> list[Task]:
        """All or none per shard (one transaction each). Over several shards every id is
        read first, so a request naming one task that is not dead requeues nothing; then
        each shard requeues its part concurrently. A shard that fails after others
        committed (an outage, or a race that changed one of its tasks) raises
        ``RequeuePartlyDone`` naming the ids requeued; the rest were not, or their outcome is
        unknown (their shard did not answer)."""
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.requeue(namespace, ids, now)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        if not ids:
            raise InvalidArgument("ids", "name at least one dead task")
        m = self._routing()
        groups = fanout.grouped([self._id_partition(i) for i in ids], m.shard_of)

        async def requeue_part(mine: list[str]) -> list[Task]:
            answers = await self._routed(
                mine,
                self._id_partition,
                lambda s, pos: s.requeue(namespace, [mine[i] for i in pos], now),
                retry=not retried,
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

    async def release_handed(
        self, leases: Mapping[str, str], fired_at: datetime, now: datetime
    ) -> Counter[tuple[str, str]]:
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.release_handed(leases, fired_at, now)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        ids = list(leases)
        answers = await self._routed(
            ids,
            self._id_partition,
            lambda s, pos: s.release_handed({ids[i]: leases[ids[i]] for i in pos}, fired_at, now),
            retry=not retried,
        )
        out: Counter[tuple[str, str]] = Counter()
        for _pos, given in answers:
            out.update(given)
        return out

    # ------------------------------------------------------------------ by placement

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
        parts = submit_partitions([(s.namespace, s.idempotency_key) for s in specs], m.partitions)
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
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.submit(specs, now)
            except PartitionMoved:
                await self._refreshed()
                retried = True
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
            retry=not retried,
        )

    async def submit_leased(self, spec: TaskSpec, now: datetime, worker_id: str) -> SubmitOutcome:
        """Placed and routed as ``submit`` places one spec (a key of a task made before
        routing answers that task, not leased). Over several shards, each shard's head of
        the queue is read first, as a claim merges them: a READY task that a claim would
        take first, on any shard, makes this a plain submit (READY, waiting its turn)."""
        if spec.run_at > now:
            raise ValueError("only a task due at once is leased by its submit")
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.submit_leased(spec, now, worker_id)
            except PartitionMoved:
                await self._refreshed()
                retried = True
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
            retry=not retried,
        )
        return outcome

    async def _old_task(self, route: legacy.Route) -> Task | None:
        """The task made before routing that an entry names (None: it is gone)."""
        try:
            return await self.get(str(route.id), route.namespace)
        except errors.TaskNotFound:
            return None

    async def submit_ids(self, specs: Sequence[TaskSpec], now: datetime) -> Accepted:
        retried = False
        if (solo := self._fast()) is not None:
            try:
                return await solo.submit_ids(specs, now)
            except PartitionMoved:
                await self._refreshed()
                retried = True
        if not specs:
            return Accepted()

        async def submit(
            s: Store, mine: list[TaskSpec], parts: list[int]
        ) -> list[tuple[str, bool]]:
            return list(await s.submit_ids(mine, now, partitions=parts))

        async def old(route: legacy.Route) -> tuple[str, bool] | None:
            return None if await self._old_task(route) is None else (str(route.id), False)

        def ids(
            s: Store, mine: list[TaskSpec], parts: list[int]
        ) -> Awaitable[list[tuple[str, bool]]]:
            return legacy.submit_routed(s, mine, parts, lambda m, p: submit(s, m, p), old)

        answer = await self._placed(specs, ids, lambda pair: pair, retry=not retried)
        return Accepted.of(specs, answer, now)

    # ------------------------------------------------------------------ by queue

    async def claim(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        max_tasks: int,
        now: datetime,
        *,
        limited: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> list[Task]:
        """Up to ``max_tasks`` across the shards; a limited queue's tokens are taken on the
        limits' shard first, and those not used given back."""
        if (solo := self._fast()) is not None:
            return await solo.claim(
                namespace, queues, worker_id, max_tasks, now, limited=limited, max_bytes=max_bytes
            )
        tasks: list[Task] = []
        capped = [q for q in queues if (namespace, q) in limited]
        free = [q for q in queues if (namespace, q) not in limited]
        budget = [max_bytes]
        for queue in capped:
            if len(tasks) >= max_tasks:
                break
            tasks += await self._claim_limited(
                namespace, queue, worker_id, max_tasks - len(tasks), now, budget
            )
        if free and len(tasks) < max_tasks:
            tasks += await self._claim_across(
                namespace, free, worker_id, max_tasks - len(tasks), now, budget
            )
        tasks.sort(key=lambda t: (-t.priority, t.run_at))
        return tasks

    async def _claim_limited(
        self,
        namespace: str,
        queue: str,
        worker_id: str,
        want: int,
        now: datetime,
        budget: list[int],
    ) -> list[Task]:
        """One limited queue: its tokens taken on the limits' shard, the claim across the
        shards, the tokens it did not use given back."""
        home = self._limits_shard
        granted = await self._on(home, lambda s: s.take_tokens(namespace, queue, want, now))
        cap = want if granted is None else granted
        if cap <= 0:
            return []
        got = await self._claim_across(namespace, [queue], worker_id, cap, now, budget)
        if granted is not None and cap > len(got):
            await self._on(home, lambda s: s.return_tokens(namespace, queue, cap - len(got)))
        return got

    async def _claim_across(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        want: int,
        now: datetime,
        budget: list[int],
    ) -> list[Task]:
        """Claim up to ``want`` of the best tasks (priority, then run_at) over the shards,
        within ``budget[0]`` bytes (always one task in all); a down shard is skipped.

        Each shard's head of the queues (at most ``want`` READY tasks, read without locks)
        is merged first (``fanout.claim_shares``) into how many each shard claims: when one
        shard holds the best, it claims alone, as one store does; when several do, each
        claims its share under a strict share of the byte budget. Every task leased is in
        the answer, so no attempt is spent on a task no worker gets. A shard whose head
        changed in between (another claim took it) claims fewer: a claim is at most
        ``want``; one that got nothing while heads were there claims on the best head's
        shard alone."""
        key = (namespace, tuple(queues))
        sole = self._sole.get(key)
        got: list[Task] = []
        if sole is not None and sole in self._stores:
            got, heads = await self._claim_sole(
                namespace, queues, worker_id, want, now, budget, sole
            )
            if not heads:
                return got
            want -= len(got)
            if want <= 0 or budget[0] <= 0:
                return got
        else:
            heads = await self._every(lambda s: s.ready_heads(namespace, queues, want, worker_id))
        shares = fanout.claim_shares(
            {n: h for n, h in heads.items() if h}, want, max(1, budget[0]), started=bool(got)
        )
        if len(self._sole) >= SOLE_ENTRIES:
            self._sole.clear()
        ready = [n for n, h in heads.items() if h]
        if len(ready) == 1 and not got and len(heads) == len(self._stores):
            self._sole[key] = ready[0]
        else:
            self._sole.pop(key, None)
        if not shares:
            return got
        lead = next(iter(shares))  # the shard of the best head (claim_shares keeps that order)
        if len(shares) == 1 and not got:
            more = await self._claim_one(namespace, queues, worker_id, want, now, budget[0], lead)
        else:
            more = await self._claim_shares(namespace, queues, worker_id, now, budget[0], shares)
            if not more and not got:
                more = await self._claim_one(
                    namespace, queues, worker_id, want, now, budget[0], lead
                )
        for task in more:
            budget[0] -= task_bytes(task)
        got += more
        got.sort(key=lambda t: (-t.priority, t.run_at))
        return got

    async def _claim_sole(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        want: int,
        now: datetime,
        budget: list[int],
        sole: str,
    ) -> tuple[list[Task], dict[str, list[fanout.Head]]]:
        """The last claim of these queues found ready tasks on ``sole`` alone: claim there
        and read the other shards' heads at once (one round trip while that stays so).
        Answers the tasks and the other shards' non-empty heads."""
        others = [n for n in self._routing().shards if n != sole and n in self._stores]

        async def heads_elsewhere() -> dict[str, list[fanout.Head]]:
            answers = await asyncio.gather(
                *(
                    self._on(n, lambda s: s.ready_heads(namespace, queues, want, worker_id))
                    for n in others
                ),
                return_exceptions=True,
            )
            out: dict[str, list[fanout.Head]] = {}
            for name, answer in zip(others, answers, strict=True):
                if isinstance(answer, StoreUnavailable):
                    self._skipped(name, answer)
                elif isinstance(answer, BaseException):
                    raise answer
                elif answer:
                    out[name] = answer
            return out

        claimed, heads = await asyncio.gather(
            self._claim_one(namespace, queues, worker_id, want, now, budget[0], sole),
            heads_elsewhere(),
            return_exceptions=True,
        )
        if isinstance(heads, BaseException):  # the claim stands; the next one reads again
            log.warning("ready heads of %s not read beside a claim: %s", others, heads)
            heads = {}
        if isinstance(claimed, StoreUnavailable):
            self._skipped(sole, claimed)
            self._sole.pop((namespace, tuple(queues)), None)
            claimed = []
        elif isinstance(claimed, BaseException):
            raise claimed
        for task in claimed:
            budget[0] -= task_bytes(task)
        if heads or not claimed:
            self._sole.pop((namespace, tuple(queues)), None)
        return claimed, heads

    async def _claim_one(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        want: int,
        now: datetime,
        max_bytes: int,
        shard: str,
    ) -> list[Task]:
        """One shard's claim of up to ``want`` within ``max_bytes`` (the first always comes)."""
        return await self._on(
            shard,
            lambda s: s.claim(namespace, queues, worker_id, want, now, max_bytes=max(1, max_bytes)),
        )

    async def _claim_shares(
        self,
        namespace: str,
        queues: Sequence[str],
        worker_id: str,
        now: datetime,
        max_bytes: int,
        shares: Mapping[str, tuple[int, int]],
    ) -> list[Task]:
        """Each shard claims its share concurrently, within its share of ``max_bytes`` (plus
        an even part of what the shares leave), strictly: together never past ``max_bytes``."""
        spare = max(0, max_bytes - sum(b for _n, b in shares.values())) // len(shares)

        def claiming(n: int, b: int) -> Callable[[Store], Awaitable[list[Task]]]:
            return lambda s: s.claim(
                namespace, queues, worker_id, n, now, max_bytes=b + spare, strict_bytes=True
            )

        names = list(shares)
        answers = await asyncio.gather(
            *(self._on(shard, claiming(*shares[shard])) for shard in names),
            return_exceptions=True,
        )
        got: list[Task] = []
        down: list[StoreUnavailable] = []
        failure: BaseException | None = None
        for shard, answer in zip(names, answers, strict=True):
            if isinstance(answer, StoreUnavailable):
                self._skipped(shard, answer)
                down.append(answer)
            elif isinstance(answer, BaseException):
                failure = answer
            else:
                got += answer
        if failure is not None:  # not an outage: what the others leased goes back READY
            await asyncio.gather(*(self._give_back(namespace, t) for t in got))
            raise failure
        if len(down) == len(names):
            raise down[0]
        return got

    async def _give_back(self, namespace: str, task: Task) -> None:
        """A task leased by a claim that then failed goes back to READY; if that fails its
        lease runs out and the reaper retries it."""
        try:
            await self.release(namespace, Lease(task.id, task.attempt))
        except (StoreUnavailable, errors.StaleLease, errors.TaskNotFound) as exc:
            log.warning("claimed task %s past the byte budget not given back: %s", task.id, exc)

    async def ready_counts(
        self, keys: Sequence[tuple[str, str]], caps: Sequence[int]
    ) -> dict[tuple[str, str], int]:
        if (solo := self._fast()) is not None:
            return await solo.ready_counts(keys, caps)
        if not keys:
            return {}
        answers = await self._every(lambda s: s.ready_counts(keys, caps))
        return fanout.capped_sums(answers.values(), dict(zip(keys, caps, strict=True)))

    async def queue_limits(self) -> dict[tuple[str, str], tuple[float, float]]:
        if (solo := self._fast()) is not None:
            return await solo.queue_limits()
        return await self._on(self._limits_shard, lambda s: s.queue_limits())

    async def set_queue_limit(
        self,
        namespace: str,
        queue: str,
        rate: float,
        burst: float,
        now: datetime,
        *,
        cap: int,
    ) -> None:
        if (solo := self._fast()) is not None:
            return await solo.set_queue_limit(namespace, queue, rate, burst, now, cap=cap)
        return await self._on(
            self._limits_shard,
            lambda s: s.set_queue_limit(namespace, queue, rate, burst, now, cap=cap),
        )

    # ------------------------------------------------------------------ admin

    async def list_tasks(
        self,
        namespace: str,
        *,
        queue: str | None = None,
        state: TaskState | None = None,
        page_size: int = 100,
        page_token: str = "",
        max_bytes: int = PAGE_BYTES,
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
            )
        pages = await self._every(
            lambda s: s.list_tasks(
                namespace,
                queue=queue,
                state=state,
                page_size=page_size,
                page_token=page_token,
                max_bytes=max_bytes,
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

    # ------------------------------------------------------------------ notices, health

    async def announce(self, channel: str, payloads: Sequence[str]) -> None:
        """On the first shard that answers: every node listens on every shard."""
        if (solo := self._fast()) is not None:
            return await solo.announce(channel, payloads)
        if not payloads:
            return
        last: StoreUnavailable | None = None
        for name in self._routing().shards:
            if name not in self._stores:
                continue
            try:
                return await self._on(name, lambda s: s.announce(channel, payloads))
            except StoreUnavailable as exc:
                last = exc
        if last is not None:
            raise last

    async def listen(
        self, channel: str, on_notice: Callable[[str], None]
    ) -> Listener | _Listenings:
        """On every shard; the listening is closed (to be opened again) once one is lost,
        or at once when a shard could not be reached."""
        if (solo := self._fast()) is not None:
            return await solo.listen(channel, on_notice)
        opened = await self._every(lambda s: s.listen(channel, on_notice))
        return _Listenings(list(opened.values()), complete=len(opened) == len(self._stores))

    async def probe(self, timeout: float = 2.0) -> bool:
        """Whether every shard answers (``probe_shard``: one)."""
        answers = await asyncio.gather(*(s.probe(timeout) for s in self._stores.values()))
        return all(answers)

    async def probe_shard(self, name: str, timeout: float = 2.0) -> bool:
        """Whether shard ``name`` answers within ``timeout`` seconds (False: no store)."""
        store = self._stores.get(name)
        return store is not None and await store.probe(timeout)

    def server_clock(self) -> AbstractAsyncContextManager[Callable[[], Awaitable[datetime]]]:
        """The first shard's server clock (``server_clock_of``: any shard's)."""
        return self.server_clock_of(self._routing().shards[0])

    @contextlib.asynccontextmanager
    async def server_clock_of(self, name: str) -> AsyncIterator[Callable[[], Awaitable[datetime]]]:
        store = self._store(name)
        try:
            async with store.server_clock() as read:
                yield read
        except ShardUnavailable:
            raise
        except StoreUnavailable as exc:
            raise ShardUnavailable(name, exc.message) from exc

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._stores.values()), return_exceptions=True)


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

    def __init__(self, store: ShardedStore, *, lookahead: timedelta = timedelta(seconds=60)):
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
