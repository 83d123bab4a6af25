"""This node's etcd lease: granted, kept alive, and a local deadline that never lies.

etcd tells a node it lost its lease only when the node asks (a refresh answers TTL 0), and
a paused process asks late. So the node keeps its own deadline: the monotonic time at which
the last successful keepalive was *sent*, plus the TTL it granted. Past it, the node acts as
if the lease were gone, whatever etcd would say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aetcd

from chronoq.coordinator.etcd import translated
from chronoq.errors import CoordinatorUnavailable

log = logging.getLogger("chronoq.coordinator")


class NodeLease:
    """Grant, keep alive and revoke one lease; call ``on_lost`` when it is gone."""

    def __init__(
        self,
        client: aetcd.Client,
        ttl: int,
        *,
        on_lost: Callable[[], None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.ttl = ttl
        self._on_lost = on_lost
        self._monotonic = monotonic
        self.id: int | None = None
        self.deadline = 0.0  # monotonic seconds
        self.renewals = 0
        self.losses = 0
        self._task: asyncio.Task[None] | None = None

    def valid(self) -> bool:
        """True while the local deadline has not passed (self-fencing check)."""
        return self.id is not None and self._monotonic() < self.deadline

    def remaining(self) -> float:
        return self.deadline - self._monotonic()

    async def grant(self) -> int:
        sent = self._monotonic()
        with translated("lease grant"):
            lease = await self._client.lease(self.ttl)
        self.id = lease.id
        self.deadline = sent + lease.ttl
        return lease.id  # type: ignore[no-any-return]

    def start(self) -> None:
        self._task = asyncio.create_task(self._keepalive(), name="chronoq-lease-keepalive")

    async def stop(self, *, revoke: bool) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        lease_id, self.id, self.deadline = self.id, None, 0.0
        if revoke and lease_id is not None:
            with contextlib.suppress(CoordinatorUnavailable), translated("lease revoke"):
                await self._client.revoke_lease(lease_id)

    async def refresh(self) -> bool:
        """One keepalive; False if etcd says the lease is gone."""
        if self.id is None:
            return False
        sent = self._monotonic()
        with translated("lease keepalive"):
            reply = await self._client.refresh_lease(self.id)
        if reply is None or reply.TTL <= 0:
            return False
        self.deadline = sent + reply.TTL
        self.renewals += 1
        return True

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(max(0.1, self.ttl / 3 if self.remaining() > self.ttl / 2 else 0.2))
            try:
                alive = await self.refresh()
            except CoordinatorUnavailable as exc:
                log.warning("lease keepalive failed (%.1f s left): %s", self.remaining(), exc)
                if self.remaining() > 0:
                    continue
                alive = False
            if not alive:
                self.losses += 1
                log.warning("lease %s lost", self.id)
                self.id, self.deadline = None, 0.0
                self._on_lost()
                return
