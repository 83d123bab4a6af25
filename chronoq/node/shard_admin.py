"""The shard map's writers on a node: add a shard, ask for moves, and the move driver's loop.

``AddShard`` may be answered by any node: it connects to the new database (bounded), migrates
it, refuses one that is registered already (its PostgreSQL system identifier and database
name are kept per shard in etcd) or that holds tasks, and registers ``shard-N`` with its DSN
masked and the map ``with_shard()`` in one etcd transaction on the map's mod revision. The
password never reaches etcd: nodes read it from their own settings or the libpq passfile.

A move is asked for by writing its record (phase ``requested``) in one transaction on the
map's mod revision; the leading node's ``MoveDriver`` (``chronoq.coordinator.moves``) runs
the records one after another. The driver and ``AddShard`` open their own small pools on the
shards (``MoverStores``): a move's long COPY streams never take the serving pools' slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aetcd

from chronoq.config import NodeSettings
from chronoq.coordinator.etcd import Keys, translated
from chronoq.coordinator.move_book import EtcdMoveBook, Stored, member_map_versions
from chronoq.coordinator.moves import MoveDriver, PartitionMover
from chronoq.coordinator.ownership import EtcdOwnership
from chronoq.errors import ChronoqError, InvalidArgument
from chronoq.errors import ShardAdminRefused as ShardAdminRefused
from chronoq.limits import (
    ADD_SHARD_TIMEOUT,
    KEPT_FINISHED_MOVES,
    MAX_DSN_CHARS,
    MAX_OPEN_MOVES,
)
from chronoq.moves import MoveRecord, Phase
from chronoq.redact import mask_dsn, mask_text
from chronoq.shardmap import (
    Move,
    ShardMap,
    parse_partitions,
    shard_number,
)
from chronoq.store import Store
from chronoq.supervision import Loop, Supervisor

log = logging.getLogger("chronoq.shards")

#: Seconds between passes of the move driver (a request wakes it at once on this node).
DRIVER_INTERVAL = 1.0
_MASKED_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:/@]*):\*\*\*@", re.IGNORECASE)


def without_masked_password(dsn: str) -> str:
    """A masked DSN as etcd holds it, minus the mask: libpq then reads the passfile."""
    return _MASKED_PASSWORD.sub(r"\1@", dsn)


def check_dsn(dsn: str) -> str:
    text = dsn.strip()
    if not text:
        raise InvalidArgument("dsn", "give the new shard's PostgreSQL DSN")
    if len(text) > MAX_DSN_CHARS:
        raise InvalidArgument(
            "dsn", f"is {len(text)} characters long; the limit is {MAX_DSN_CHARS}"
        )
    if any(c in text for c in "\x00\r\n"):
        raise InvalidArgument("dsn", "must be one line without NUL characters")
    return text


async def connect_shard(
    dsn: str, partitions: int, holds: Sequence[int], *, max_size: int = 4
) -> Store:
    """A pool on one shard that claims exactly ``holds`` if the shard holds nothing yet."""
    extra: dict[str, Any] = {}
    if "holds" in inspect.signature(Store.connect).parameters:
        extra["holds"] = tuple(holds)
    return await Store.connect(
        dsn, partitions=partitions, min_size=1, max_size=max_size, command_timeout=15.0, **extra
    )


async def identity(store: Store) -> str:
    """The database's identity: its cluster's system identifier and its name (a replica, a
    second host name or a physical copy of a registered shard has the same)."""
    async with store.connection() as conn:
        try:
            sysid = await conn.fetchval("SELECT system_identifier::text FROM pg_control_system()")
        except Exception as exc:  # noqa: BLE001 - a managed server may refuse the function
            log.info("pg_control_system() refused (%s): identity by server address", exc)
            sysid = await conn.fetchval(
                "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || "
                "current_setting('port')"
            )
        name = await conn.fetchval("SELECT current_database()")
    return f"{sysid}/{name}"


class MoverStores:
    """Pools on the shards for the mover and ``AddShard``, opened on first use."""

    def __init__(
        self,
        settings: NodeSettings,
        masked_dsns: Callable[[], Mapping[str, str]],
        current_map: Callable[[], ShardMap | None],
    ) -> None:
        self._settings = settings
        self._masked = masked_dsns
        self._map = current_map
        self._added: dict[str, str] = {}  # DSNs given to AddShard on this node (memory only)
        self._open: dict[str, Store] = {}
        self._lock = asyncio.Lock()

    def remember(self, shard: str, dsn: str) -> None:
        self._added[shard] = dsn

    def dsn_of(self, shard: str) -> str:
        number = shard_number(shard)
        if number == 0:
            return self._settings.dsn
        configured: Sequence[str] = getattr(self._settings, "store_shards", ())
        if number <= len(configured):
            return configured[number - 1]
        if shard in self._added:
            return self._added[shard]
        masked = self._masked().get(shard)
        if masked is None:
            raise ShardAdminRefused(f"no DSN is known for {shard}: register it with add-shard")
        return without_masked_password(masked)

    async def store(self, shard: str) -> Store:
        async with self._lock:
            found = self._open.get(shard)
            if found is not None:
                return found
            current = self._map()
            # What an empty shard_partitions table takes: version 1's placement (the
            # cluster's first map), nothing for a shard registered later.
            holds = current.held_by(shard) if current is not None and current.version == 1 else ()
            opened = await asyncio.wait_for(
                connect_shard(self.dsn_of(shard), self._settings.partitions, holds),
                ADD_SHARD_TIMEOUT,
            )
            self._open[shard] = opened
            return opened

    async def close(self) -> None:
        for store in self._open.values():
            with contextlib.suppress(Exception):
                await store.close()
        self._open.clear()


@dataclass(frozen=True)
class AddedShard:
    name: str
    dsn: str  # masked
    map_version: int


class ShardAdmin:
    """``AddShard``, move requests and the move driver of one node of an etcd cluster."""

    def __init__(
        self,
        client: aetcd.Client,
        keys: Keys,
        settings: NodeSettings,
        stores: MoverStores,
        driver: MoveDriver,
        book: EtcdMoveBook,
    ) -> None:
        self._client = client
        self._keys = keys
        self._settings = settings
        self.stores = stores
        self.driver = driver
        self.book = book
        self._adding = asyncio.Lock()
        self._loop: Loop | None = None

    # ------------------------------------------------------------------ add a shard

    async def add_shard(self, dsn: str) -> AddedShard:
        dsn = check_dsn(dsn)
        masked = mask_dsn(dsn)
        async with self._adding:
            try:
                new = await asyncio.wait_for(
                    connect_shard(dsn, self._settings.partitions, (), max_size=1),
                    ADD_SHARD_TIMEOUT,
                )
            except (ChronoqError, OSError, ValueError, TimeoutError) as exc:
                why = exc.message if isinstance(exc, ChronoqError) else f"{type(exc).__name__}"
                raise ShardAdminRefused(
                    f"cannot connect to and migrate {masked} within {ADD_SHARD_TIMEOUT:.0f} s: "
                    f"{mask_text(why)}"
                ) from None
            try:
                ident = await identity(new)
                async with new.connection() as conn:
                    # Finished tasks retired into the history count too.
                    busy = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM tasks_with_history)")
            finally:
                await new.close()
            if busy:
                raise ShardAdminRefused(
                    f"{masked} holds tasks already: a new shard must be an empty database"
                )
            return await self._register(dsn, masked, ident)

    async def _register(self, dsn: str, masked: str, ident: str) -> AddedShard:
        current, map_rev = await self.book.read_map()
        if any(s.record.phase is Phase.CUT_OVER for s in await self.book.records()):
            raise ShardAdminRefused("a move is cutting over: add the shard in a moment")
        with translated("read shard identities"):
            known = {
                kv.key[len(self._keys.shard_ids) :].decode(errors="replace"): kv.value.decode(
                    errors="replace"
                )
                for kv in await self._client.get_prefix(self._keys.shard_ids)
            }
        missing = {}
        for shard in current.shards:
            if shard not in known:
                with contextlib.suppress(ChronoqError, OSError, TimeoutError):
                    missing[shard] = await identity(await self.stores.store(shard))
        for shard, other in {**known, **missing}.items():
            if other == ident:
                raise ShardAdminRefused(f"{masked} is {shard} already (the same database)")
        bigger = current.with_shard()
        name = bigger.shards[-1]
        tx = self._client.transactions
        with translated("register a shard"):
            ok, _ = await self._client.transaction(
                compare=[
                    tx.mod(self._keys.shard_map) == map_rev,
                    tx.create(self._keys.shard_dsn(name)) == 0,
                ],
                success=[
                    tx.put(self._keys.shard_map, bigger.to_json().encode()),
                    tx.put(self._keys.shard_dsn(name), masked.encode()),
                    tx.put(self._keys.shard_id(name), ident.encode()),
                    *(tx.put(self._keys.shard_id(s), v.encode()) for s, v in missing.items()),
                ],
                failure=[],
            )
        if not ok:
            raise ShardAdminRefused("the shard map changed meanwhile: run add-shard again")
        self.stores.remember(name, dsn)
        log.info("registered %s (%s): shard map version %d", name, masked, bigger.version)
        await self._copy_queue_settings(current.shards[0], name)
        return AddedShard(name, masked, bigger.version)

    async def _copy_queue_settings(self, first: str, name: str) -> None:
        """The new shard takes the first shard's queue settings (each shard's claims read
        their own copy; later settings are written to every shard the map names). Logged
        when it cannot: the settings are then set again to reach it."""
        try:
            rows = await (await self.stores.store(first)).gated_queues()
            await (await self.stores.store(name)).copy_queue_settings(rows)
        except (ChronoqError, OSError, TimeoutError) as exc:
            log.warning("queue settings not copied to %s: %s", name, exc)

    # ------------------------------------------------------------------ moves

    async def request_move(self, partitions: str, target: str) -> list[MoveRecord]:
        current, map_rev = await self.book.read_map()
        try:
            shard_number(target)
        except ValueError as exc:
            raise InvalidArgument("target", str(exc)) from None
        wanted = parse_partitions(partitions, current.partitions)
        return await self._request(current, map_rev, current.plan_move(wanted, target))

    async def rebalance(self, dry_run: bool) -> list[MoveRecord]:
        current, map_rev = await self.book.read_map()
        plan = current.plan_rebalance()
        if dry_run:
            return [MoveRecord("", m.partitions, m.source, m.target) for m in plan]
        if not plan:
            return []
        return await self._request(current, map_rev, plan)

    async def _request(
        self, current: ShardMap, map_rev: int, moves: Sequence[Move]
    ) -> list[MoveRecord]:
        stored = await self.book.records()
        open_ = [s.record for s in stored if not s.record.final]
        for rec in open_:
            for move in moves:
                overlap = set(rec.partitions) & set(move.partitions)
                if overlap:
                    raise ShardAdminRefused(
                        f"partition {min(overlap)} is in move {rec.id} ({rec.phase.value}) "
                        "already: wait for it to finish"
                    )
        if len(open_) + len(moves) > MAX_OPEN_MOVES:
            raise ShardAdminRefused(
                f"{len(open_)} moves are open; a cluster keeps at most {MAX_OPEN_MOVES}: "
                "wait for some to finish"
            )
        now = time.time()
        records = [MoveRecord.requested(m, current.version, now) for m in moves]
        tx = self._client.transactions
        with translated("request a move"):
            ok, _ = await self._client.transaction(
                compare=[tx.mod(self._keys.shard_map) == map_rev],
                success=[
                    *(tx.put(self._keys.move(r.id), r.to_json().encode()) for r in records),
                    *(tx.delete(self._keys.move(r.id)) for r in _prunable(stored)),
                ],
                failure=[],
            )
        if not ok:
            raise ShardAdminRefused("the shard map changed meanwhile: ask for the move again")
        log.info("moves requested: %s", "; ".join(f"{r.id} {r.move}" for r in records))
        self.driver.wake.set()
        return records

    async def moves(self) -> list[MoveRecord]:
        """Every move record in etcd (open and recently finished), oldest first."""
        return [s.record for s in await self.book.records()]

    # ------------------------------------------------------------------ the driver

    def start(self, supervisor: Supervisor) -> Loop:
        self._loop = supervisor.every(
            "move-driver",
            self.driver.step,
            interval=DRIVER_INTERVAL,
            wake=self.driver.wake,
            initial_delay=False,
            critical=False,  # a failed move is rolled back; serving does not depend on it
        )
        return self._loop

    async def close(self) -> None:
        await self.stores.close()


def _prunable(stored: Sequence[Stored]) -> list[MoveRecord]:
    """Finished records beyond the ones kept, oldest first."""
    done = [s.record for s in stored if s.record.final]
    return done[: max(0, len(done) - KEPT_FINISHED_MOVES)]


def make_mover(
    freeze_budget: float,
) -> Callable[[Any, Any, tuple[int, ...], str, int], PartitionMover]:
    """The factory of the shards' side of a move (``chronoq.store.mover.PartitionMove``),
    which first builds the routes to tasks made before routing (``chronoq.store.legacy``)."""
    from chronoq.store.legacy import RoutesFirst

    def make(
        source: Any, target: Any, partitions: tuple[int, ...], move_id: str, token: int
    ) -> PartitionMover:
        return RoutesFirst(source, target, partitions, move_id, token, freeze_budget=freeze_budget)

    return make


def attach(
    ownership: EtcdOwnership, settings: NodeSettings, *, freeze_budget: float = 1.0
) -> ShardAdmin:
    """The shard admin of a node of an etcd cluster, on its ownership's client and lease."""
    view = ownership.shard_map
    stores = MoverStores(settings, lambda: view.dsns, lambda: view.current)

    def versions() -> dict[str, int | None]:
        members = [m.node_id for m in ownership.live_members()]
        return member_map_versions(members, ownership.member_stats())

    book = EtcdMoveBook(ownership.client, ownership.keys, lambda: ownership.lease.id, versions)
    driver = MoveDriver(
        book,
        stores,
        make_mover(freeze_budget),
        node_id=settings.node_id,
        leads=ownership.leads,
        freeze_budget=freeze_budget,
    )
    return ShardAdmin(ownership.client, ownership.keys, settings, stores, driver, book)
