"""This node's etcd lease: granted, kept alive, and a local deadline that never lies.

etcd tells a node it lost its lease only when the node asks (a refresh answers TTL 0), and
a paused process asks late. So the node keeps its own deadline: the monotonic time at which
the last successful keepalive was *sent*, plus the TTL it granted. Past it, the node acts as
if the lease were gone, whatever etcd would say.

The keepalive is a supervised loop from ``start`` to ``stop``. While there is no lease (lost,
until the owner grants a new one) its passes fail, so the loop reads as failing, and a long
gap turns the node's health NOT_SERVING like any other loop that cannot do its job.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import aetcd

from chronoq.coordinator.etcd import translated
from chronoq.errors import CoordinatorUnavailable
from chronoq.supervision import Loop, Supervisor

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
        supervisor: Supervisor | None = None,
    ) -> None:
        self._client = client
        self._supervisor = supervisor or Supervisor()
        self.ttl = ttl
        self._on_lost = on_lost
        self._monotonic = monotonic
        self.id: int | None = None
        self.deadline = 0.0  # monotonic seconds
        self.renewals = 0
        self.losses = 0
        self._loop: Loop | None = None

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
        """Keep the lease alive until ``stop`` (a no-op while already running)."""
        if self._loop is None:
            self._loop = self._supervisor.every(
                "lease-keepalive",
                self.keep,
                interval=self._next_keepalive,
                backoff=False,  # the deadline does not wait: retry at the usual pace
                initial_delay=True,
            )

    def _next_keepalive(self) -> float:
        return max(0.1, self.ttl / 3 if self.remaining() > self.ttl / 2 else 0.2)

    async def stop(self, *, revoke: bool) -> None:
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None
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

    async def keep(self) -> None:
        """One keepalive pass; raises while the lease cannot be renewed or is gone."""
        if self.id is None:
            raise CoordinatorUnavailable("etcd: no lease (lost; waiting for a new one)")
        try:
            alive = await self.refresh()
        except CoordinatorUnavailable as exc:
            if self.remaining() > 0:
                raise CoordinatorUnavailable(f"{exc} ({self.remaining():.1f} s left)") from exc
            alive = False
        if not alive:
            self.losses += 1
            log.warning("lease %s lost", self.id)
            self.id, self.deadline = None, 0.0
            self._on_lost()
            raise CoordinatorUnavailable("etcd: lease lost")
