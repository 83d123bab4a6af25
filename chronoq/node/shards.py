"""A node's store shards: one ``Store`` per shard of the map, and each shard's liveness.

The node reads the shard map before it opens any store (``ShardMapView.start``), then opens
one ``Store`` per shard the map names: with the DSN it was given for that shard
(``--dsn`` for ``shard-0``, ``--store-shard`` for ``shard-1``, ...), else with the DSN the
cluster registered in etcd (its password masked there: the node takes it from the libpq
password file, ``PGPASSFILE``). A shard it cannot open yet is opened again in the
background (``ShardStores.open_missing``); meanwhile it counts as down.

``ShardWatch`` keeps one store shard's outage that shard's (design record, "One shard down"):
a shard that no probe has reached for ``grace`` seconds is *held out* when no other member
reaches it either (its partitions' keys stay with their owners, nobody fires them, the node
fires and accepts submits for the other shards), and the whole node steps out (suspends, as
a node cut off from its only store does) when others do reach it: they can serve every shard.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from chronoq.config import NodeSettings
from chronoq.coordinator.protocols import Ownership
from chronoq.errors import ChronoqError
from chronoq.redact import MASK, mask_dsn, mask_text, split_password
from chronoq.shardmap import ShardMap, shard_number
from chronoq.supervision import Loop, Supervisor

log = logging.getLogger("chronoq.node")

# A masked libpq keyword password (``password=***``), dropped so that the password file
# applies.
_MASKED_KEYWORD = re.compile(r"(?i)\bpassword\s*=\s*" + re.escape(MASK) + r"(\s+|$)")


def without_masked_password(dsn: str) -> str:
    """``dsn`` as etcd holds it (password masked) without that mask: libpq and asyncpg then
    read the password from the password file (``PGPASSFILE``) or ``PGPASSWORD``."""
    bare, password = split_password(dsn)
    if password == MASK:
        return bare
    return _MASKED_KEYWORD.sub("", dsn).strip()


def reach_dsn(name: str, own: Sequence[str], registered: Mapping[str, str]) -> str | None:
    """The DSN this node connects to shard ``name`` with: its own (``own[n]`` for
    ``shard-n``), else the cluster's registered one; None when it has neither."""
    number = shard_number(name)
    if number < len(own):
        return own[number]
    found = registered.get(name)
    return without_masked_password(found) if found is not None else None


def holds_at_start(name: str, current: ShardMap) -> tuple[int, ...]:
    """What shard ``name`` holds when its ``shard_partitions`` table is still empty: its
    partitions of the map's version 1 (the cluster's first map), nothing for a shard
    registered later (it receives partitions by moves only)."""
    return current.held_by(name) if current.version == 1 else ()


class _Closable(Protocol):
    async def close(self) -> None: ...


S = TypeVar("S", bound=_Closable)


class ShardStores(Generic[S]):
    """The node's open stores, by shard, and opening those the map names but it lacks."""

    def __init__(
        self,
        settings: NodeSettings,
        current: Callable[[], ShardMap],
        registered: Callable[[], Mapping[str, str]],
        opener: Callable[[str, str, tuple[int, ...]], Awaitable[S]],
        *,
        on_opened: Callable[[str, S], None] = lambda _n, _s: None,
    ) -> None:
        self._own = (settings.dsn, *settings.store_shards)
        self._current = current
        self._registered = registered
        self._opener = opener
        self._on_opened = on_opened
        self.stores: dict[str, S] = {}
        #: Why a shard could not be opened, by shard (its DSN masked).
        self.failures: dict[str, str] = {}
        self._lock = asyncio.Lock()

    def missing(self) -> list[str]:
        """Shards of the current map this node has no store for."""
        return [s for s in self._current().shards if s not in self.stores]

    async def open(self, name: str) -> S:
        """Open shard ``name`` (``ChronoqError`` naming it, DSN masked, when it fails)."""
        dsn = reach_dsn(name, self._own, self._registered())
        if dsn is None:
            raise ChronoqError(
                f"store {name}: no DSN (give it with --store-shard, or register it with "
                "`chronoq store add-shard`)"
            )
        try:
            store = await self._opener(name, dsn, holds_at_start(name, self._current()))
        except ChronoqError as exc:
            raise ChronoqError(f"store {name} ({mask_dsn(dsn)}): {mask_text(exc.message)}") from exc
        return store

    async def open_missing(self) -> list[str]:
        """Open every shard the map names that has no store yet; returns those opened. A
        shard that fails stays missing (its reason in ``failures``) until the next pass."""
        opened: list[str] = []
        async with self._lock:
            for name in self.missing():
                try:
                    store = await self.open(name)
                except ChronoqError as exc:
                    if self.failures.get(name) != exc.message:
                        log.warning("%s; trying again", exc.message)
                    self.failures[name] = exc.message
                    continue
                self.failures.pop(name, None)
                self.stores[name] = store
                self._on_opened(name, store)
                opened.append(name)
                log.info("store %s opened", name)
        return opened

    async def close(self) -> None:
        stores, self.stores = self.stores, {}
        await asyncio.gather(*(s.close() for s in stores.values()), return_exceptions=True)


def cause(shard: str) -> str:
    """The ``Ownership.hold_out`` cause of a shard's outage."""
    return f"store {shard} down"


class ShardWatch:
    """Each store shard's liveness, and what the node does about a shard that is down.

    Every ``interval`` each shard is probed (concurrently, each probe bounded). A shard no
    probe reached for ``grace`` seconds is down:

    - nobody else reaches it either (``elsewhere(shard)`` false): its partitions are held
      out (``Ownership.hold_out``: keys kept, nothing fired), the rest fires;
    - other members reach it (``elsewhere(shard, after)``: one answered it later than
      ``after``, the later of this node's last answer plus a probe interval and the start
      of its first probe that failed): the node suspends (hands every partition off), since
      they can serve every shard and this node cannot. Answers from before that only show
      the others had not noticed yet: when a shard goes down for every node at once, each
      would otherwise read the others' last answers, still fresh, and the whole cluster
      would step out, the other shards' partitions with it. The first failure counts, not
      only the last answer: on a busy host a late probe round is more than an interval
      after the last answer, and the others' answers in between are from a live shard.
      Each answer is stamped when it came, not when the round's slowest probe ended.

    A down shard that answers again is brought back (its partitions backfill); a node that
    stepped out rejoins once every shard answers (and ``may_resume``, the clock check).
    """

    def __init__(
        self,
        probe: Callable[[str, float], Awaitable[bool]],
        current: Callable[[], ShardMap],
        ownership: Ownership,
        *,
        grace: float,
        interval: float = 1.0,
        elsewhere: Callable[[str, float], bool] = lambda _s, _after: False,
        may_resume: Callable[[], bool] = lambda: True,
        on_health: Callable[[str, bool], Awaitable[None]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self._current = current
        self._ownership = ownership
        self._grace = grace
        self._interval = interval
        self._elsewhere = elsewhere
        self._may_resume = may_resume
        self._on_health = on_health
        self._monotonic = monotonic
        self._since = monotonic()
        self.ok_at: dict[str, float] = {}  # monotonic time of each shard's last answer
        #: Monotonic start of the first failed probe of each shard since its last answer.
        self.failed_at: dict[str, float] = {}
        #: Shards down now, each with why (for health and status).
        self.down: dict[str, str] = {}
        self.stepped_out = False  # this watch suspended the node (others reach the shard)
        self.suspensions = 0

    def start(self, supervisor: Supervisor) -> Loop:
        return supervisor.every(
            "shard-watch", self.check, interval=self._interval, initial_delay=True
        )

    def ok_epoch(self) -> dict[str, float]:
        """Each shard's last answer in epoch seconds (published in the member stats)."""
        wall, mono = time.time(), self._monotonic()
        return {s: wall - (mono - at) for s, at in self.ok_at.items()}

    def problems(self) -> list[str]:
        """The down shards, named (the node serves the others)."""
        return [f"store {s} down: {why}" for s, why in sorted(self.down.items())]

    async def check(self) -> None:
        current = self._current()
        timeout = max(0.2, min(2.0, self._grace / 2))
        started = self._monotonic()
        answers = await asyncio.gather(*(self._answer(s, timeout) for s in current.shards))
        now = self._monotonic()
        cut_off: list[str] = []
        for shard, (ok, answered) in zip(current.shards, answers, strict=True):
            if ok:
                self.ok_at[shard] = answered
                self.failed_at.pop(shard, None)
                if shard in self.down:
                    del self.down[shard]
                    log.warning("store %s answers again", shard)
                    self._ownership.bring_back(cause(shard))
                    await self._health(shard, True)
                continue
            failed = self.failed_at.setdefault(shard, started)
            if now - self.ok_at.get(shard, self._since) <= self._grace:
                continue
            last = self.ok_epoch().get(shard, 0.0)
            lost = time.time() - (now - failed)  # epoch of the first failed probe
            others = self._elsewhere(shard, max(last + self._interval, lost) if last else 0.0)
            if others:
                cut_off.append(shard)
            reason = "unreachable from this node" if others else "unreachable"
            if shard not in self.down:
                log.warning("store %s %s for %.1f s", shard, reason, self._grace)
                await self._health(shard, False)
            self.down[shard] = reason
            self._ownership.hold_out(
                cause(shard), frozenset(current.held_by(shard)), f"store {shard} {reason}"
            )
        for gone in [s for s in self.down if s not in current.shards]:
            del self.down[gone]
            self._ownership.bring_back(cause(gone))
        if cut_off and not self._ownership.suspended:
            self.stepped_out = True
            self.suspensions += 1
            await self._ownership.suspend(
                reason=f"store {', '.join(cut_off)} unreachable from this node only"
            )
        elif (
            self.stepped_out
            and not self.down
            and self._ownership.suspended
            and self._may_resume()
        ):
            self.stepped_out = False
            await self._ownership.resume()

    async def _answer(self, shard: str, timeout: float) -> tuple[bool, float]:
        ok = await self._probe(shard, timeout)
        return ok, self._monotonic()

    async def _health(self, shard: str, ok: bool) -> None:
        if self._on_health is not None:
            await self._on_health(shard, ok)

