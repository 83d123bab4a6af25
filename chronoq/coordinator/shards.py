"""The shard map in etcd: created once per cluster, read at start, then watched.

The first node of a cluster writes version 1 of the map, the partitions split evenly in
contiguous ranges over ``shard-0`` and the shards it was started with (``--store-shard``;
``shard-0`` alone holds everything without), and each shard's DSN with its password masked,
in one transaction that only creates them while the map key is absent, so concurrent first
nodes make one map. An existing cluster keeps its map: shards are added by
``chronoq store add-shard``, never by a node's settings. Every node
then follows ``/chronoq/<cluster>/shards/`` with a ``PrefixView``: a value ``from_json``
refuses is logged and ignored whole, and the last good map stays. A node started with another
partition count than the map's refuses to start (``ConfigError``): nodes that disagree on
``--partitions`` would place and fire the same tasks in different partitions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import aetcd

from chronoq.coordinator.etcd import Keys, translated
from chronoq.coordinator.view import PrefixView
from chronoq.errors import ChronoqError, ConfigError
from chronoq.redact import mask_dsn
from chronoq.shardmap import ShardMap, ShardMapInvalid, even, registered, shard_name
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
        shard_dsns: Sequence[str] = (),
        first_is_empty: Callable[[], Awaitable[bool]] | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._partitions = partitions
        #: shard-0, shard-1, ... as this node was configured, passwords masked.
        self._dsns = [mask_dsn(d) for d in (dsn, *shard_dsns)]
        #: Whether shard-0 holds no row yet: asked only when a first map would split.
        self._first_is_empty = first_is_empty
        self.current: ShardMap | None = None
        #: Called with the new map each time ``current`` changes (after the first read too).
        self.on_map: list[Callable[[ShardMap], None]] = []
        self._changes = 0
        self._changed_event = asyncio.Event()
        self._refreshing: asyncio.Task[None] | None = None
        self._started = False
        self.dsns: dict[str, str] = {}
        #: Why the map in etcd was last refused (None while the map read is good).
        self.error: str | None = None
        self._last_value = b""
        self.view = PrefixView(
            client, keys.shards, self._changed, supervisor=supervisor, name="watch-shards"
        )

    @property
    def client(self) -> aetcd.Client:
        """The etcd client the view reads with (the node's ownership shares it)."""
        return self._client

    async def create_if_absent(self) -> bool:
        """Write the even map over the configured shards unless a map exists; whether this
        call created it."""
        tx = self._client.transactions
        key = self._keys.shard_map
        first = await self._first_map()
        if first is None:
            return False
        with translated("create the shard map"):
            created, _ = await self._client.transaction(
                compare=[tx.create(key) == 0],
                success=[
                    tx.put(key, first.to_json().encode()),
                    *(
                        tx.put(self._keys.shard_dsn(shard_name(n)), dsn.encode())
                        for n, dsn in enumerate(self._dsns)
                    ),
                ],
                failure=[],
            )
        if created:
            log.info(
                "shard map created: %s",
                ", ".join(f"{name} holds {n}" for name, n in first.sizes().items()),
            )
        return bool(created)

    async def _first_map(self) -> ShardMap | None:
        """The map a first node writes (None: a map exists already). Split evenly only over
        an empty ``shard-0``: a store upgraded to shards keeps every partition where its rows
        are (split, the other shards would hold partitions whose tasks stayed on shard-0)."""
        if len(self._dsns) == 1:
            return even(self._partitions, 1)
        with translated("read the shard map"):
            found = await self._client.get(self._keys.shard_map)
        if found is not None:
            return None
        if self._first_is_empty is None or await self._first_is_empty():
            return even(self._partitions, len(self._dsns))
        log.warning(
            "shard-0 holds tasks already: the first shard map registers %d shards with every "
            "partition on shard-0; spread them with `chronoq store rebalance`",
            len(self._dsns),
        )
        return registered(self._partitions, len(self._dsns))

    async def start(self) -> None:
        """Create the map if absent, read it, check the partition count, then watch (once:
        the node starts it before its stores, the ownership again)."""
        if self._started:
            return
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
        self._compare_settings(self.current)
        self._started = True
        self.view.watch()

    def _compare_settings(self, current: ShardMap) -> None:
        """Say where this node's shard DSNs and the cluster's map disagree (the map wins)."""
        extra = [n for n in range(len(self._dsns)) if shard_name(n) not in current.shards]
        if extra:
            log.warning(
                "this node was given %d store shards, the cluster's map has %d (%s): the map "
                "stays; register the others with `chronoq store add-shard DSN` (%s)",
                len(self._dsns),
                len(current.shards),
                ", ".join(current.shards),
                ", ".join(self._dsns[n] for n in extra),
            )
        for n, mine in enumerate(self._dsns):
            theirs = self.dsns.get(shard_name(n))
            if theirs is not None and n > 0 and theirs != mine:
                log.warning(
                    "%s: this node was given %s, the cluster registered %s: using this "
                    "node's DSN",
                    shard_name(n),
                    mine,
                    theirs,
                )

    @property
    def changes(self) -> int:
        """How many times ``current`` has changed (a reader waits for it to grow)."""
        return self._changes

    async def refresh(self, timeout: float = 1.0) -> None:
        """Bring ``current`` up to date: read the map from etcd now, and if it is the one
        already held, wait for the watch to bring a newer one (at most ``timeout`` seconds).

        For a write a shard refused because its partition is moving: after the cut-over the
        read finds the new version at once; during the frozen step the next version follows
        within the freeze. Concurrent callers share one read.
        """
        seen = self._changes
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._reread())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await asyncio.wait_for(asyncio.shield(self._refreshing), timeout)
        except (TimeoutError, ChronoqError):
            return  # etcd is slow or out of reach: route by the map held
        while self._changes == seen:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._changed_event.clear()
            try:
                await asyncio.wait_for(self._changed_event.wait(), left)
            except TimeoutError:
                return

    async def _reread(self) -> None:
        with translated("read the shard map"):
            found = await self._client.get(self._keys.shard_map)
        if found is not None:
            self._apply(found.value, found.mod_revision)

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
        self._apply(found.value, found.mod_revision)

    def _apply(self, value: bytes, revision: int) -> None:
        """Take ``value`` as the map if it is a good one, newer than the map held."""
        if self.current is not None and value == self._last_value:
            return
        try:
            parsed = ShardMap.from_json(value)
        except ShardMapInvalid as exc:
            self.error = str(exc)
            log.error(
                "refused the shard map at etcd revision %d: %s; keeping version %s",
                revision,
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
        if self.current is not None and parsed.version < self.current.version:
            return  # an older read than the watch's (a refresh racing it): keep the newer
        self.current = parsed
        self._last_value = value
        self.error = None
        self._changes += 1
        self._changed_event.set()
        for listener in self.on_map:
            try:
                listener(parsed)
            except Exception:  # one listener's fault must not stop the map for the others
                log.exception("a shard map listener failed")
