"""The dispatch gate: whether a queue's tasks may reach a worker by a hand-off, or by claims only.

A queue is *gated* when it has a dispatch limit (``queue_limits``: its claims take tokens from
the limit) or settings that pause it or limit it per concurrency key (``queue_settings``). A
gated queue is never handed off, neither by the wheel's fire (``handoff``), nor by a submit
(``submit_handoff``), nor to a worker stream: its tasks go READY and claims take them, where
the store's statement enforces the gate (a paused queue is skipped in SQL, per-key counts are
counted there). The hand-off statements refuse a queue whose settings gate it as well, so a
node whose gate has not read a new pause yet cannot hand one of its tasks off: this view only
spares the others a hand-off that would be refused.

One per node, read by its claims, its streams and its hand-offs. It is read again from the
store when a claim finds it older than ``REFRESH`` (one read at a time, however many claims
ask), and changed at once on the node that wrote a setting (``changed``). Other nodes have no
notice of a setting (none exists for the dispatch limits either): they read it within
``REFRESH``, while the store's statements hold it from the instant it committed.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Protocol

from chronoq.queue_settings import QueueSettings

Key = tuple[str, str]  # (namespace, queue)

#: The gate is read again this often (a new limit or setting reaches every node within it).
REFRESH = timedelta(seconds=2)


class GateStore(Protocol):
    """What the gate reads (``chronoq.store.port.ByQueue`` has both)."""

    async def queue_limits(self) -> dict[Key, tuple[float, float]]: ...

    async def gated_queues(self) -> list[QueueSettings]: ...


class Gate:
    """The gated queues as last read from the store: those with a dispatch limit and the
    settings of those paused or limited per key."""

    def __init__(self, refresh: timedelta = REFRESH) -> None:
        self._refresh = refresh.total_seconds()
        self._limited: frozenset[Key] = frozenset()
        self._settings: dict[Key, QueueSettings] = {}
        self._gated: frozenset[Key] = frozenset()
        self._paused: frozenset[Key] = frozenset()
        self._read = float("-inf")
        self._reading: asyncio.Future[None] | None = None
        #: Settings changed here while a read was in flight: applied over what it read.
        self._changed_meanwhile: dict[Key, QueueSettings] = {}
        self.reads = 0

    def known(self) -> frozenset[Key] | None:
        """The gated queues (never handed off), None before the first read (then nothing is
        handed off)."""
        return None if self._read == float("-inf") else self._gated

    def limited(self) -> frozenset[Key]:
        """The queues with a dispatch limit, as last read."""
        return self._limited

    def paused(self) -> frozenset[Key]:
        """The paused queues, as last read (or changed here)."""
        return self._paused

    def settings(self, key: Key) -> QueueSettings | None:
        """The settings of a gated queue (None: its settings gate nothing, as last read)."""
        return self._settings.get(key)

    async def current(self, store: GateStore) -> frozenset[Key]:
        """The queues with a dispatch limit (which claims take tokens for), read again when
        the last read is older than ``REFRESH``."""
        now = asyncio.get_running_loop().time()
        if now - self._read > self._refresh:
            await self.refresh(store)
        return self._limited

    async def refresh(self, store: GateStore) -> None:
        """Read the gate now; callers arriving while a read is in flight wait for that one."""
        if self._reading is None or self._reading.done():
            self._changed_meanwhile = {}
            self._reading = asyncio.ensure_future(self._read_from(store))
            # Its failure is seen by whoever awaits it; none left (all cancelled): dropped.
            self._reading.add_done_callback(lambda f: f.cancelled() or f.exception())
        # Shielded: a cancelled claim leaves the read to the others waiting for it.
        await asyncio.shield(self._reading)

    async def _read_from(self, store: GateStore) -> None:
        try:
            limits = await store.queue_limits()
            gated = await store.gated_queues()
        finally:
            meanwhile, self._changed_meanwhile = self._changed_meanwhile, {}
        settings = {s.key: s for s in gated}
        for key, changed in meanwhile.items():
            _put(settings, key, changed)
        self._limited = frozenset(limits)
        self._install(settings)
        self._read = asyncio.get_running_loop().time()
        self.reads += 1

    def changed(self, settings: QueueSettings) -> None:
        """This node wrote ``settings``: it holds here at once (for a read in flight too)."""
        if self._reading is not None and not self._reading.done():
            self._changed_meanwhile[settings.key] = settings
        current = dict(self._settings)
        _put(current, settings.key, settings)
        self._install(current)

    def _install(self, settings: dict[Key, QueueSettings]) -> None:
        # New objects, never changed in place: the metrics page reads them from its thread.
        self._settings = settings
        self._paused = frozenset(k for k, s in settings.items() if s.paused)
        self._gated = self._limited | frozenset(settings)


def _put(settings: dict[Key, QueueSettings], key: Key, value: QueueSettings) -> None:
    if value.gated:
        settings[key] = value
    else:
        settings.pop(key, None)
