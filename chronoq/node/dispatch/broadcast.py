"""Notices between nodes over PostgreSQL NOTIFY/LISTEN: one channel, one sender, one listener.

Nodes tell each other two things this way (``ReadyBroadcast``: which queues have new ready
tasks; ``SoonBroadcast``: which tasks were just submitted for the next seconds). Both work the
same: what this node has to say gathers while one NOTIFY is in flight and goes out as the
next (so a busy node sends about one per round trip, a quiet one adds no delay); every node
keeps one listening connection per channel and skips its own notices. Delivery is best
effort: a lost notice costs a fallback (a probe, a load), never a task.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from chronoq.errors import ChronoqError
from chronoq.store.port import Listening, Notices

log = logging.getLogger("chronoq.node")

#: A NOTIFY payload must stay under 8000 bytes: notices are split or shortened below this.
NOTICE_BYTES = 7000

Body = TypeVar("Body")


class Broadcast(ABC, Generic[Body]):
    """One channel's sender and listener; subclasses say what is pending, how it is written
    and read, and what a heard notice does."""

    #: The PostgreSQL channel.
    channel: str

    def __init__(self, notices: Notices, node_id: str) -> None:
        self._notices = notices
        self.node_id = node_id
        self._flush: asyncio.Task[None] | None = None
        self._listening: Listening | None = None
        self.sent = 0
        self.heard = 0

    # ---------------------------------------------------------------- the subclass's part

    @abstractmethod
    def _has_pending(self) -> bool:
        """Something waits to be sent."""

    @abstractmethod
    def _take_payloads(self) -> list[str]:
        """Everything pending as payloads (each under ``NOTICE_BYTES``); pending is empty after."""

    @abstractmethod
    def _decode(self, payload: str) -> tuple[str, Body]:
        """(sending node, what it said); ValueError or TypeError if it is not a notice."""

    @abstractmethod
    def _deliver(self, body: Body) -> None:
        """Act on what another node said."""

    # ---------------------------------------------------------------- shared

    @property
    def listening(self) -> bool:
        return self._listening is not None and not self._listening.closed

    def _send_soon(self) -> None:
        """Start sending what is pending, unless a send is in flight (it takes it next)."""
        if self._has_pending() and (self._flush is None or self._flush.done()):
            self._flush = asyncio.get_running_loop().create_task(
                self._send(), name=f"chronoq-{self.channel}-publish"
            )

    async def _send(self) -> None:
        while self._has_pending():
            payloads = self._take_payloads()
            try:
                await self._notices.announce(self.channel, payloads)
                self.sent += 1
            except ChronoqError as exc:
                log.debug("notice on %s not sent (best effort): %s", self.channel, exc)

    def _heard(self, payload: str) -> None:
        try:
            sender, body = self._decode(payload)
        except (ValueError, TypeError):
            log.debug("ignored a malformed notice on %s", self.channel)
            return
        if sender != self.node_id:  # its own notices did their work here already
            self.heard += 1
            self._deliver(body)

    async def keep_listening(self) -> None:
        """One pass of the listener loop: (re)open the listening connection if it is not up."""
        if self.listening:
            return
        if self._listening is not None:
            log.warning("lost the %s listening connection: reconnecting", self.channel)
            lost, self._listening = self._listening, None  # said once: the loop reports the rest
            # Over shards, one lost part closes the whole listening while the others' stay
            # open: close them here, or each pass leaves its sessions to the GC.
            await lost.close()
        self._listening = await self._notices.listen(self.channel, self._heard)

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        if self._listening is not None:
            await self._listening.close()
            self._listening = None
