"""A cluster-wide virtual clock kept in etcd: the system clock plus a shared offset.

Tests and the lab advance it ("one minute later") and every node fires by it. Time keeps
flowing between jumps, so leases and ticks behave as usual. Each node follows the offset
through a watch; ``advance`` is a compare-and-swap on the key's revision, so two concurrent
advances both count.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import aetcd

from chronoq.coordinator.etcd import EtcdSettings, Keys, connect, translated
from chronoq.coordinator.view import PrefixView


class EtcdClock:
    """``now()`` = system time + the offset stored at ``/chronoq/<cluster>/clock``."""

    def __init__(self, settings: EtcdSettings, client: aetcd.Client | None = None) -> None:
        self.keys = Keys(settings.cluster)
        self._own_client = client is None
        self.client = client or connect(settings)
        self.on_jump: Callable[[], None] = lambda: None
        self._view = PrefixView(self.client, self.keys.clock, lambda: self.on_jump())

    async def start(self) -> None:
        with translated("read clock"):
            await self._view.start()

    async def stop(self) -> None:
        await self._view.stop()
        if self._own_client:
            await self.client.close()

    @property
    def offset(self) -> timedelta:
        entry = self._view.items.get(self.keys.clock)
        if entry is None:
            return timedelta(0)
        try:
            return timedelta(milliseconds=int(json.loads(entry.value)["offset_ms"]))
        except (ValueError, KeyError, TypeError):
            return timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    async def advance(self, delta: timedelta) -> datetime:
        """Move the cluster's time forward (or back) by ``delta``; returns the new now."""
        tx = self.client.transactions
        while True:
            with translated("read clock"):
                current = await self.client.get(self.keys.clock)
            offset_ms = 0
            compare = [tx.create(self.keys.clock) == 0]
            if current is not None:
                offset_ms = int(json.loads(current.value)["offset_ms"])
                compare = [tx.mod(self.keys.clock) == current.mod_revision]
            new = offset_ms + int(delta / timedelta(milliseconds=1))
            body = json.dumps({"offset_ms": new}).encode()
            with translated("advance clock"):
                ok, _ = await self.client.transaction(
                    compare=compare, success=[tx.put(self.keys.clock, body)], failure=[]
                )
            if ok:
                return datetime.now(UTC) + timedelta(milliseconds=new)
