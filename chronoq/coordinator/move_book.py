"""The etcd side of the move driver: the ``MoveBook`` port and ``EtcdMoveBook`` on the keys.

A move record lives at ``/chronoq/<cluster>/moves/<id>``; its move key
(``/chronoq/<cluster>/move-keys/<id>``) is created only if absent, on the driving node's lease,
and its create revision is the *move token*. Every record write compares that key, so a driver
that lost it can write neither the record nor the commit (map v+1 and the record in one
transaction). The driver itself is ``chronoq.coordinator.moves``; the unit tests give a fake book.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aetcd

from chronoq.coordinator.etcd import Keys, translated
from chronoq.errors import MoveLost as MoveLost
from chronoq.moves import MoveRecord, MoveRecordInvalid
from chronoq.shardmap import ShardMap, ShardMapInvalid

log = logging.getLogger("chronoq.moves")

#: The member-stats field in which a node reports the map version it routes by.
MAP_VERSION_STAT = "map_version"


@dataclass(frozen=True)
class Stored:
    """A record as etcd holds it, with its revisions."""

    record: MoveRecord
    mod_revision: int
    create_revision: int


class MoveBook(Protocol):
    """What the driver reads and writes in etcd."""

    async def records(self) -> list[Stored]:
        """Every parsable move record, oldest first."""
        ...

    async def get(self, move_id: str) -> Stored | None: ...

    async def claim(self, move_id: str) -> int | None:
        """Create the move key on this node's lease: its token, or None when held."""
        ...

    async def held(self, move_id: str) -> bool: ...

    async def release(self, move_id: str, token: int) -> None: ...

    async def put(self, record: MoveRecord, token: int) -> int:
        """Write ``record`` while the move key's token is ``token`` (``MoveLost`` otherwise);
        its mod revision."""
        ...

    async def read_map(self) -> tuple[ShardMap, int]:
        """The map and its mod revision."""
        ...

    async def commit(
        self,
        record: MoveRecord,
        record_revision: int,
        new_map: ShardMap,
        map_revision: int,
        token: int,
    ) -> bool:
        """Put ``new_map`` and ``record`` in one transaction, if the map, the record and the
        move key are unchanged; whether it did."""
        ...

    def map_versions(self) -> Mapping[str, int | None]:
        """Each live member's reported map version (None: it reports none)."""
        ...


class EtcdMoveBook:
    """``MoveBook`` on a cluster's etcd keys, the move keys on this node's lease."""

    def __init__(
        self,
        client: aetcd.Client,
        keys: Keys,
        lease_id: Callable[[], int | None],
        map_versions: Callable[[], Mapping[str, int | None]],
    ) -> None:
        self._client = client
        self._keys = keys
        self._lease_id = lease_id
        self._map_versions = map_versions

    async def records(self) -> list[Stored]:
        with translated("read move records"):
            found = await self._client.get_prefix(self._keys.moves)
        out = []
        for kv in found:
            try:
                out.append(
                    Stored(MoveRecord.from_json(kv.value), kv.mod_revision, kv.create_revision)
                )
            except MoveRecordInvalid as exc:
                log.error("ignored the move record %r: %s", kv.key[:80], exc)
        return sorted(out, key=lambda s: s.create_revision)

    async def get(self, move_id: str) -> Stored | None:
        with translated("read a move record"):
            kv = await self._client.get(self._keys.move(move_id))
        if kv is None:
            return None
        return Stored(MoveRecord.from_json(kv.value), kv.mod_revision, kv.create_revision)

    async def claim(self, move_id: str) -> int | None:
        lease = self._lease_id()
        if lease is None:
            return None
        key = self._keys.move_key(move_id)
        tx = self._client.transactions
        with translated("take a move key"):
            ok, resp = await self._client.transaction(
                compare=[tx.create(key) == 0],
                success=[tx.put(key, b"", lease=lease)],
                failure=[],
            )
        return _put_revision(resp) if ok else None

    async def held(self, move_id: str) -> bool:
        with translated("read a move key"):
            return await self._client.get(self._keys.move_key(move_id)) is not None

    async def release(self, move_id: str, token: int) -> None:
        key = self._keys.move_key(move_id)
        tx = self._client.transactions
        with translated("release a move key"):
            await self._client.transaction(
                compare=[tx.create(key) == token], success=[tx.delete(key)], failure=[]
            )

    async def put(self, record: MoveRecord, token: int) -> int:
        key = self._keys.move_key(record.id)
        tx = self._client.transactions
        with translated("write a move record"):
            ok, resp = await self._client.transaction(
                compare=[tx.create(key) == token],
                success=[tx.put(self._keys.move(record.id), record.to_json().encode())],
                failure=[],
            )
        if not ok:
            raise MoveLost(f"move {record.id}: this node no longer holds its key")
        return _put_revision(resp)

    async def read_map(self) -> tuple[ShardMap, int]:
        with translated("read the shard map"):
            kv = await self._client.get(self._keys.shard_map)
        if kv is None:
            raise ShardMapInvalid("the shard map is absent from etcd: start a node first")
        return ShardMap.from_json(kv.value), int(kv.mod_revision)

    async def commit(
        self,
        record: MoveRecord,
        record_revision: int,
        new_map: ShardMap,
        map_revision: int,
        token: int,
    ) -> bool:
        tx = self._client.transactions
        move = self._keys.move(record.id)
        with translated("commit a move"):
            ok, _ = await self._client.transaction(
                compare=[
                    tx.mod(self._keys.shard_map) == map_revision,
                    tx.mod(move) == record_revision,
                    tx.create(self._keys.move_key(record.id)) == token,
                ],
                success=[
                    tx.put(self._keys.shard_map, new_map.to_json().encode()),
                    tx.put(move, record.to_json().encode()),
                ],
                failure=[],
            )
        return bool(ok)

    def map_versions(self) -> Mapping[str, int | None]:
        return self._map_versions()


def _put_revision(responses: Any) -> int:
    """The revision of a transaction's first put (aetcd answers a list of responses)."""
    return int(responses[0].response_put.header.revision)


def member_map_versions(
    members: list[str], stats: Mapping[str, Mapping[str, Any]]
) -> dict[str, int | None]:
    """Each live member's reported map version, from the member stats."""
    out: dict[str, int | None] = {}
    for node in members:
        value = stats.get(node, {}).get(MAP_VERSION_STAT)
        out[node] = int(value) if isinstance(value, int | float) else None
    return out


def describe(stored: list[Stored]) -> str:
    """The open moves in one line, for logs."""
    return json.dumps([s.record.id for s in stored if not s.record.final])
