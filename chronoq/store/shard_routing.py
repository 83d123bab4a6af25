"""Routing over the shards of a store: the map, and the fan-out every call of the store of
shards goes through (``chronoq.store.sharded``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from chronoq import errors
from chronoq.errors import PartitionMoved, ShardUnavailable, StoreUnavailable
from chronoq.routing import id_partition
from chronoq.shardmap import ShardMap
from chronoq.store import fanout
from chronoq.store.rows import parse_task_id
from chronoq.store.store import Store

log = logging.getLogger("chronoq.store")

#: A task as the timing wheel holds it (``port.DueSoon``; the port imports this module).
DueSoon = tuple[str, int, datetime, str, str]
#: Seconds a call refused with ``PartitionMoved`` waits for the node's map to refresh.
REFRESH_S = 1.0
#: Seconds between two warnings about the same down shard skipped by a fan-out.
SKIP_WARN_S = 10.0
#: Seconds a probe of a failing shard may take before it counts as no answer.
FAILING_PROBE_S = 2.0

R = TypeVar("R")
K = TypeVar("K")


@dataclass(frozen=True)
class Route:
    """A call the one store did not answer goes through the map: ``retry``, whether a
    moved partition may still be routed again once (not after the one store refused it)."""

    retry: bool


class ShardRouting:
    """The shards' stores and the map calls are routed by, and the fan-out every port of
    ``ShardedStore`` goes through (one shard, shards by key, every shard).

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
        #: Per shard, the probe of ``probe_any`` still in flight (at most one a shard).
        self._any_probes: dict[str, asyncio.Task[bool]] = {}
        #: Shards whose last call failed, with the probe that clears them (``_failing``).
        self._failures: dict[str, asyncio.Task[bool] | None] = {}
        self._routing()

    # ------------------------------------------------------------------ the map

    @property
    def stores(self) -> Mapping[str, Store]:
        """Each shard's store, by shard name."""
        return dict(self._stores)

    def add_store(self, name: str, store: Store) -> None:
        """Open routing to one more shard (before a map that places partitions there), or
        to a shard again through a new store (what the old one failed is not held against it)."""
        self._stores[name] = store
        probe = self._failures.pop(name, None)
        if probe is not None:
            probe.cancel()
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
        """``call`` on one shard; its outage named (and the shard marked failing)."""
        store = self._store(shard)
        try:
            return await call(store)
        except PartitionMoved:
            raise
        except ShardUnavailable:
            self._failed(shard)
            raise
        except StoreUnavailable as exc:
            self._failed(shard)
            raise ShardUnavailable(shard, exc.message) from exc

    # ------------------------------------------------------------------ failing shards

    def _failed(self, shard: str) -> None:
        """Mark ``shard`` failing: calls whose parts stand alone leave it out until a probe
        of it answers. A shard whose server died takes a second or more to fail each call
        (a failover's connects, a cut link's timeout), and an owner's writes wait for one
        another: asked again by every call, it would hold up the other shards' firing."""
        probe = self._failures.get(shard)
        if probe is None or probe.done():  # a probe that answered before this failure
            self._failures[shard] = None
        log.debug("store %s failed: left out of calls over shards until it answers", shard)

    def _failing(self, shard: str) -> bool:
        """Whether ``shard`` failed its last call and no probe has answered since; starts
        the probe (one in flight a shard, each bounded) while none is running."""
        if shard not in self._failures:
            return False
        probe = self._failures[shard]
        if probe is not None and probe.done():
            if not probe.cancelled() and probe.exception() is None and probe.result():
                del self._failures[shard]
                return False
            probe = None
        store = self._stores.get(shard)
        if probe is None and store is not None:
            self._failures[shard] = asyncio.ensure_future(_answers(store))
        return True

    def _left_out(self, names: Sequence[str]) -> tuple[list[str], list[BaseException]]:
        """``names`` split into those to ask and the errors of the failing ones; every
        one failing: a ``ShardUnavailable`` at once, without a call that would wait."""
        failing = [n for n in names if self._failing(n)]
        if not failing:
            return list(names), []
        asked = [n for n in names if n not in failing]
        if not asked:
            raise ShardUnavailable(
                failing[0], "it did not answer its last call, nor a probe since; retry in a moment"
            )
        skipped: list[BaseException] = []
        for name in failing:
            exc = ShardUnavailable(name, "left out: it did not answer its last call")
            self._skipped(name, exc)
            skipped.append(exc)
        return asked, skipped

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
        the first failure is raised once all have ended (the others' writes committed). With
        ``skip_down`` (calls whose parts stand alone: owner statements, reads), a shard that
        refused some partitions only (a move freezing them) is asked again at once for the
        rest, so its other partitions do not wait for the cut-over."""
        m = self._routing()
        parts = [partition_of(k) for k in keys]
        groups = fanout.grouped(parts, m.shard_of)
        names = list(groups)
        down: list[BaseException] = []
        if skip_down and self._failures:
            names, down = self._left_out(names)

        def bound(positions: list[int]) -> Callable[[Store], Awaitable[R]]:
            return lambda s: call(s, positions)

        answers = await asyncio.gather(
            *(self._on(n, bound(groups[n])) for n in names), return_exceptions=True
        )
        done: list[tuple[list[int], R]] = []
        moved: list[int] = []
        spared: list[int] = []
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, PartitionMoved) and (retry or skip_down):
                refused = set(answer.partitions) if skip_down else set()
                spared += [i for i in groups[name] if refused and parts[i] not in refused]
                rest = [i for i in groups[name] if not refused or parts[i] in refused]
                if retry:
                    moved += rest
                elif rest:
                    down.append(answer)
            elif isinstance(answer, StoreUnavailable) and skip_down:
                down.append(answer)
                self._skipped(name, answer)
            elif isinstance(answer, BaseException):
                down.append(answer)
            else:
                done.append((groups[name], answer))
        if spared:  # nothing of a refused statement was written: the rest, at once
            done += await self._again(keys, partition_of, call, spared, skip_down, down)
        if moved:
            await self._refreshed()
            done += await self._again(keys, partition_of, call, moved, skip_down, down)
        if down and (not skip_down or not done):
            raise down[0]
        return done

    async def _again(
        self,
        keys: Sequence[K],
        partition_of: Callable[[K], int],
        call: Callable[[Store, list[int]], Awaitable[R]],
        positions: list[int],
        skip_down: bool,
        down: list[BaseException],
    ) -> list[tuple[list[int], R]]:
        """``positions`` of ``keys`` routed once more (no further retry). With ``skip_down``
        its failure joins ``down`` and the other shards' answers stand (they committed)."""
        try:
            again = await self._routed(
                [keys[i] for i in positions],
                partition_of,
                lambda s, ps: call(s, [positions[i] for i in ps]),
                skip_down=skip_down,
                retry=False,
            )
        except StoreUnavailable as exc:
            if not skip_down:
                raise
            down.append(exc)
            return []
        return [([positions[i] for i in ps], r) for ps, r in again]

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
        down: list[BaseException] = []
        if skip_down and self._failures:
            names, down = self._left_out(names)
        answers = await asyncio.gather(*(self._on(n, call) for n in names), return_exceptions=True)
        out: dict[str, R] = {}
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

    async def _straight(self, call: Callable[[Store], Awaitable[R]]) -> R | Route:
        """``call`` on the one store holding every partition, if one does; else, or when
        that store refused a moved partition (the map refreshed then), a ``Route`` saying
        whether the routed call still has its one retry."""
        solo = self._fast()
        if solo is None:
            return Route(retry=True)
        try:
            return await call(solo)
        except PartitionMoved:
            await self._refreshed()
            return Route(retry=False)

    def _fast(self) -> Store | None:
        """The one store holding every partition of the current map, if one does."""
        self._routing()
        return self._solo


async def _answers(store: Store) -> bool:
    """A failing shard's probe, bounded even where a cut link holds its connect."""
    try:
        return await asyncio.wait_for(store.probe(FAILING_PROBE_S), FAILING_PROBE_S + 0.5)
    except Exception:  # noqa: BLE001 - a probe that failed in any way answered no
        return False
