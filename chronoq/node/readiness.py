"""Wakes long-polling claims when tasks of their queue become READY on this node."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class ReadyNotifier:
    """One event per (namespace, queue), replaced each time it fires."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}

    def notify(self, keys: Iterable[tuple[str, str]]) -> None:
        for key in keys:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    async def wait(self, namespace: str, queues: Iterable[str], timeout: float) -> bool:
        """Wait until one of the queues may have ready tasks; False on timeout."""
        events = [self._events.setdefault((namespace, q), asyncio.Event()) for q in queues]
        waiters = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waiters:
                w.cancel()
        return bool(done)
