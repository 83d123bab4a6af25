"""Rows from before routing: keyed tasks placed by their id's hash, schedules by theirs.

A keyed task made before routing (a v7 or v4 id) sits in the partition of its id's hash, and a
submit of its key now goes to the key's partition (``chronoq.routing``). While one shard holds
every partition, that shard's unique index on (namespace, idempotency_key) still decides. Once
partitions move, the two can be on different shards, and a repeated submit would make a
second task. So, before the first move:

- **build**: the shard holding every partition reads its keyed rows whose id is not version 8,
  in pages (the key partitions computed here, as routing does), and records an entry in
  ``legacy_routes`` for each one whose key partition is not its row's, *in the key's
  partition*: a move carries the entry with the key (the mover tracks the table like tasks).
  Its schedules with ids from before routing are re-homed to the partition of their
  (namespace, name), which is where the store of shards looks for them (nothing finds a
  schedule by id: its occurrences and the materialiser take the row's partition as stored).
  The build records its progress in ``legacy_build``: it resumes after a crash and runs once.
  No node of this release makes a row of the old kind, so nothing races the build.
- **probe**: a keyed submit reaching a shard that has entries looks its keys up there before
  the insert; a key with an entry is answered by its old task (``created`` false), read by id
  on the shard of the old row's partition. An entry whose task is gone (purged) is dropped
  and the submit made as usual. Whether a shard has entries is asked once per map version:
  entries reach a shard only by the build (before any move, while one shard holds all, so no
  probe is needed) or by a move, whose commit is a new version.
- **sweep** (retention): a page of the entries of the partitions being purged, per call;
  those whose task no longer exists are dropped.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from chronoq.errors import StoreUnavailable
from chronoq.models import TaskSpec
from chronoq.routing import key_partition, submit_partitions
from chronoq.store.connection import Connected
from chronoq.store.mover import PartitionMove

#: ``legacy_routes.kind`` of an idempotency key (later routing keys take other numbers).
IDEMPOTENCY_KEY = 0
#: Rows a page of the build reads (one statement each, and one transaction per page).
BUILD_PAGE = 5000
#: Entries a retention pass checks per shard.
SWEEP_PAGE = 1000
#: The id before every id: where the build and the sweep start.
_FIRST = uuid.UUID(int=0)

_HOLDS_ALL = "SELECT count(*) FILTER (WHERE state = 0) = $1 FROM shard_partitions"
_BUILD_STATE = """
INSERT INTO legacy_build DEFAULT VALUES ON CONFLICT (only_row) DO NOTHING;
"""
_BUILD_ROW = "SELECT tasks_after, routes, rehomed, finished_at FROM legacy_build"
# Keyed rows of ids minted before routing (not version 8: byte 6 is 0x81 on a new id), by id.
_OLD_KEYED = """
SELECT id, namespace, idempotency_key, partition FROM tasks
WHERE id > $1 AND idempotency_key IS NOT NULL AND get_byte(uuid_send(id), 6) <> 129
ORDER BY id LIMIT $2
"""
_ADD_ROUTES = """
INSERT INTO legacy_routes (id, partition, kind, namespace, key, row_partition)
SELECT * FROM unnest($1::uuid[], $2::smallint[], $3::smallint[], $4::text[], $5::text[],
                     $6::smallint[])
ON CONFLICT DO NOTHING
"""
_PAGE_DONE = "UPDATE legacy_build SET tasks_after = $1, routes = routes + $2"
_OLD_SCHEDULES = """
SELECT id, namespace, name, partition FROM schedules WHERE get_byte(uuid_send(id), 6) <> 129
"""
# Moved only if still where it was read (a schedule deleted or re-homed meanwhile is left).
_REHOME = """
UPDATE schedules s SET partition = n.partition
FROM unnest($1::uuid[], $2::smallint[], $3::smallint[]) AS n(id, partition, was)
WHERE s.id = n.id AND s.partition = n.was
"""
_FINISHED = "UPDATE legacy_build SET rehomed = rehomed + $1, finished_at = now()"
_ANY = "SELECT EXISTS (SELECT 1 FROM legacy_routes)"
# One index lookup per key (LATERAL ... LIMIT 1): a join would hash the whole table, whose
# cost grows with the routes rather than with the batch.
_PROBE = """
SELECT o.n, r.id, r.row_partition
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS o(namespace, key, n)
CROSS JOIN LATERAL (
    SELECT id, row_partition FROM legacy_routes
    WHERE namespace = o.namespace AND kind = 0 AND key = o.key
    LIMIT 1
) r
"""
_DROP = "DELETE FROM legacy_routes WHERE id = ANY($1::uuid[])"
_SWEEP = """
SELECT id, namespace, key, row_partition FROM legacy_routes
WHERE partition = ANY($1::smallint[]) AND id > $2 ORDER BY id LIMIT $3
"""
# A task moved into its history (retention's sweep) is still there: its key still answers it.
_PRESENT = """
SELECT id FROM tasks WHERE id = ANY($1::uuid[])
UNION ALL
SELECT id FROM task_history WHERE id = ANY($1::uuid[])
"""

R = TypeVar("R")


@dataclass(frozen=True)
class Route:
    """An entry: the key's old task (``id``), whose row is in ``row_partition``."""

    namespace: str
    key: str
    id: uuid.UUID
    row_partition: int


@dataclass(frozen=True)
class Built:
    """What a build did: entries recorded, schedules re-homed, keyed old rows read; or why
    it did nothing (``skipped``)."""

    routes: int = 0
    rehomed: int = 0
    read: int = 0
    skipped: str = ""


def routes_needed(
    rows: Sequence[tuple[uuid.UUID, str, str, int]], partitions: int
) -> list[tuple[uuid.UUID, int, str, str, int]]:
    """Of keyed rows (id, namespace, key, row partition), those a submit of the key would not
    reach: (id, key partition, namespace, key, row partition). Pure."""
    keyed = submit_partitions([(ns, key) for _id, ns, key, _p in rows], partitions)
    return [
        (task_id, k, ns, key, p)
        for (task_id, ns, key, p), k in zip(rows, keyed, strict=True)
        if k != p
    ]


def rehoming(
    rows: Iterable[tuple[uuid.UUID, str, str, int]], partitions: int
) -> list[tuple[uuid.UUID, int, int]]:
    """Of schedules (id, namespace, name, partition), those not in the partition of their
    (namespace, name): (id, that partition, the partition they are in). Pure."""
    out = []
    for schedule_id, ns, name, p in rows:
        home = key_partition(ns, name, partitions)
        if home != p:
            out.append((schedule_id, home, p))
    return out


async def build(store: Connected, *, page: int = BUILD_PAGE) -> Built:
    """Build the routes on ``store``, which must hold every partition live (before the first
    move); a no-op once built, or on a shard that does not hold every partition (a cluster
    whose routes were built before its first move, or that began with several shards)."""
    async with store.connection() as conn:
        if not await conn.fetchval(_HOLDS_ALL, store.partitions):
            return Built(skipped="this shard does not hold every partition")
        await conn.execute(_BUILD_STATE)
        state = await conn.fetchrow(_BUILD_ROW)
    if state["finished_at"] is not None:
        return Built(state["routes"], state["rehomed"], 0, skipped="built already")
    after: uuid.UUID = state["tasks_after"]
    read = routes = 0
    while True:
        async with store.connection() as conn:
            rows = await conn.fetch(_OLD_KEYED, after, page)
            if not rows:
                break
            found = [(r["id"], r["namespace"], r["idempotency_key"], r["partition"]) for r in rows]
            needed = routes_needed(found, store.partitions)
            after = rows[-1]["id"]
            async with conn.transaction():
                if needed:
                    ids, parts, nss, keys, rows_at = zip(*needed, strict=True)
                    await conn.execute(
                        _ADD_ROUTES,
                        list(ids),
                        list(parts),
                        [IDEMPOTENCY_KEY] * len(ids),
                        list(nss),
                        list(keys),
                        list(rows_at),
                    )
                await conn.execute(_PAGE_DONE, after, len(needed))
        read += len(rows)
        routes += len(needed)
        if len(rows) < page:
            break
    async with store.connection() as conn:
        # Schedules are few (a namespace has a cap): one read, one update.
        moved = rehoming(
            [
                (r["id"], r["namespace"], r["name"], r["partition"])
                for r in await conn.fetch(_OLD_SCHEDULES)
            ],
            store.partitions,
        )
        async with conn.transaction():
            if moved:
                ids, homes, was = zip(*moved, strict=True)
                await conn.execute(_REHOME, list(ids), list(homes), list(was))
            await conn.execute(_FINISHED, len(moved))
    return Built(routes, len(moved), read)


class RoutesFirst(PartitionMove):
    """A partition move that builds the routes on its source before its first phase: the
    first move out of the shard that held every partition (later ones find them built)."""

    async def prepare(self) -> None:
        await build(self.source)
        await super().prepare()


#: Per store: the map version at which it was asked whether it has entries, and the answer.
_HAS: weakref.WeakKeyDictionary[Any, tuple[int, bool]] = weakref.WeakKeyDictionary()


async def has_routes(store: Connected) -> bool:
    """Whether ``store`` has entries, asked once per map version of the store."""
    version = int(getattr(store, "map_version", 1))
    known = _HAS.get(store)
    if known is not None and known[0] == version:
        return known[1]
    async with store.connection() as conn:
        found = bool(await conn.fetchval(_ANY))
    _HAS[store] = (version, found)
    return found


async def probe(store: Connected, specs: Sequence[TaskSpec]) -> dict[int, Route]:
    """The entries of the specs' idempotency keys on ``store``, by position of the spec."""
    keyed = [(i, s.namespace, s.idempotency_key) for i, s in enumerate(specs) if s.idempotency_key]
    if not keyed or not await has_routes(store):
        return {}
    async with store.connection() as conn:
        rows = await conn.fetch(_PROBE, [ns for _i, ns, _k in keyed], [k for _i, _ns, k in keyed])
    out = {}
    for r in rows:
        i, ns, key = keyed[r["n"] - 1]
        assert key is not None
        out[i] = Route(ns, key, r["id"], r["row_partition"])
    return out


async def drop(store: Connected, ids: Sequence[uuid.UUID]) -> None:
    """Drop the entries of these old tasks (they are gone)."""
    if ids:
        async with store.connection() as conn:
            await conn.execute(_DROP, list(ids))


async def submit_routed(
    store: Connected,
    specs: Sequence[TaskSpec],
    partitions: Sequence[int],
    submit: Callable[[list[TaskSpec], list[int]], Awaitable[list[R]]],
    answer: Callable[[Route], Awaitable[R | None]],
) -> list[R]:
    """``submit`` on ``store`` of the specs whose key has no entry there; the others answered
    by ``answer`` (the old task, not created; None: it is gone, so its entry is dropped and
    the spec submitted with the rest). Per spec, in order."""
    hits = await probe(store, specs)
    if not hits:
        return await submit(list(specs), list(partitions))
    found = dict(zip(hits, await asyncio.gather(*(answer(r) for r in hits.values())), strict=True))
    await drop(store, [hits[i].id for i, a in found.items() if a is None])
    rest = [i for i in range(len(specs)) if found.get(i) is None]
    made = await submit([specs[i] for i in rest], [partitions[i] for i in rest]) if rest else []
    out: dict[int, R] = dict(zip(rest, made, strict=True))
    for i, a in found.items():
        if a is not None:
            out[i] = a
    return [out[i] for i in range(len(specs))]


async def present(store: Connected, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Which of these task ids ``store`` has."""
    if not ids:
        return set()
    async with store.connection() as conn:
        return {r["id"] for r in await conn.fetch(_PRESENT, list(ids))}


async def sweep(
    stores: Mapping[str, Connected],
    shard_of: Callable[[int], str],
    partitions: Sequence[int],
    cursors: dict[str, uuid.UUID],
    *,
    page: int = SWEEP_PAGE,
) -> int:
    """Retention: on each shard holding some of ``partitions`` and having entries, check the
    next ``page`` of their entries (from ``cursors``, kept by the caller between passes) and
    drop those whose task is gone from its row's shard. The entries dropped. A shard that
    does not answer is left for a later pass."""
    by_shard: dict[str, list[int]] = {}
    for p in partitions:
        by_shard.setdefault(shard_of(p), []).append(p)
    dropped = 0
    for shard, mine in by_shard.items():
        store = stores.get(shard)
        if store is None:
            continue
        try:
            if not await has_routes(store):
                continue
            after = cursors.get(shard, _FIRST)
            async with store.connection() as conn:
                rows = await conn.fetch(_SWEEP, mine, after, page)
            cursors[shard] = rows[-1]["id"] if len(rows) == page else _FIRST
            routes = [Route(r["namespace"], r["key"], r["id"], r["row_partition"]) for r in rows]
            gone = await _gone(stores, shard_of, routes)
            await drop(store, gone)
            dropped += len(gone)
        except StoreUnavailable:
            continue
    return dropped


async def _gone(
    stores: Mapping[str, Connected], shard_of: Callable[[int], str], routes: Sequence[Route]
) -> list[uuid.UUID]:
    """The old tasks of ``routes`` that no longer exist on the shard of their row."""
    where: dict[str, list[uuid.UUID]] = {}
    for r in routes:
        where.setdefault(shard_of(r.row_partition), []).append(r.id)
    gone: list[uuid.UUID] = []
    for shard, ids in where.items():
        store = stores.get(shard)
        if store is None:
            continue  # unknown here: kept, checked again later
        found = await present(store, ids)
        gone += [i for i in ids if i not in found]
    return gone
