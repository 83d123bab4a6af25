"""The shard map in etcd: created once per cluster, read at start, then watched.

The first node of a cluster writes ``ShardMap.single(P)`` (``shard-0`` holds everything,
version 1) and ``shard-0``'s DSN with its password masked, in one transaction that only
creates them while the map key is absent, so concurrent first nodes make one map. Every node
then follows ``/chronoq/<cluster>/shards/`` with a ``PrefixView``: a value ``from_json``
refuses is logged and ignored whole, and the last good map stays. A node started with another
partition count than the map's refuses to start (``ConfigError``): nodes that disagree on
``--partitions`` would place and fire the same tasks in different partitions.
"""

from __future__ import annotations

import logging

import aetcd

from chronoq.coordinator.etcd import Keys, translated
from chronoq.coordinator.view import PrefixView
from chronoq.errors import ConfigError
from chronoq.redact import mask_dsn
from chronoq.shardmap import ShardMap, ShardMapInvalid, shard_name, single
from chronoq.supervision import Supervisor

log = logging.getLogger("chronoq.coordinator")


class ShardMapView:
    """The cluster's shard map (``current``) and each shard's masked DSN (``dsns``)."""

    def __init__(
        self,
        client: aetcd.Client,
        keys: Keys,
        partitions: int,
        dsn: str,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._partitions = partitions
        self._dsn = mask_dsn(dsn)
        self.current: ShardMap | None = None
        self.dsns: dict[str, str] = {}
        #: Why the map in etcd was last refused (None while the map read is good).
        self.error: str | None = None
        self._last_value = b""
        self.view = PrefixView(
            client, keys.shards, self._changed, supervisor=supervisor, name="watch-shards"
        )

    async def create_if_absent(self) -> bool:
        """Write the single-shard map unless a map exists; whether this call created it."""
        tx = self._client.transactions
        key = self._keys.shard_map
        with translated("create the shard map"):
            created, _ = await self._client.transaction(
                compare=[tx.create(key) == 0],
                success=[
                    tx.put(key, single(self._partitions).to_json().encode()),
                    tx.put(self._keys.shard_dsn(shard_name(0)), self._dsn.encode()),
                ],
                failure=[],
            )
        if created:
            log.info("shard map created: shard-0 holds %d partitions", self._partitions)
        return bool(created)

    async def start(self) -> None:
        """Create the map if absent, read it, check the partition count, then watch."""
        await self.create_if_absent()
        await self.view.resync()
        if self.current is None:
            raise ConfigError(
                f"the shard map in etcd ({self._keys.shard_map.decode()}) is unreadable: "
                f"{self.error}; repair it before starting a node"
            )
        if self.current.partitions != self._partitions:
            raise ConfigError(
                f"this node was started with --partitions {self._partitions}, but cluster "
                f"{self._keys.cluster!r} has {self.current.partitions} partitions (its shard "
                f"map in etcd): start every node with --partitions {self.current.partitions}"
            )
        self.view.watch()

    async def stop(self) -> None:
        await self.view.stop()

    def _changed(self) -> None:
        dsns: dict[str, str] = {}
        prefix = self._keys.shard_dsns
        for key, entry in self.view.items.items():
            if key.startswith(prefix):
                # Masked again on the way out: a DSN written by hand may carry a password.
                dsns[key[len(prefix) :].decode(errors="replace")] = mask_dsn(
                    entry.value.decode(errors="replace")
                )
        self.dsns = dsns
        found = self.view.items.get(self._keys.shard_map)
        if found is None:
            return  # deleted by hand: route by the last good map
        if self.current is not None and found.value == self._last_value:
            return
        try:
            parsed = ShardMap.from_json(found.value)
        except ShardMapInvalid as exc:
            self.error = str(exc)
            log.error(
                "refused the shard map at etcd revision %d: %s; keeping version %s",
                found.mod_revision,
                exc,
                self.current.version if self.current is not None else "none",
            )
            return
        if self.current is not None and parsed.partitions != self.current.partitions:
            self.error = (
                f"shard map version {parsed.version} has {parsed.partitions} partitions, "
                f"this cluster {self.current.partitions}"
            )
            log.error(
                "refused the shard map: %s; keeping version %d", self.error, self.current.version
            )
            return
        self.current = parsed
        self._last_value = found.value
        self.error = None
