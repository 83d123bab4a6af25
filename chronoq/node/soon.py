"""Near-future submits reach their owner's timing wheel at once, whichever node took them.

A task submitted for the next seconds on a node that does not own its partition would wait
for its owner's next load (up to a quarter of the wheel's horizon). Instead the submitting
node sends, after the insert committed, one NOTIFY on ``SOON_CHANNEL`` per batch of such
tasks: their ids, partitions and instants while they fit in one notice, else only the
partitions, which their owners then read again (one statement). Notices go out at once, and
while one is in flight the next ones gather into a single NOTIFY, so a busy node sends about
one per round trip, never one per task. Delivery is best effort: a lost notice costs the
owner's next load, never a task.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Sequence

from chronoq.errors import ChronoqError
from chronoq.node.readiness import NOTICE_BYTES, Listening, ReadyNotices
from chronoq.wheel import Due

log = logging.getLogger("chronoq.node")

#: The PostgreSQL channel of near-future submits.
SOON_CHANNEL = "chronoq_soon"
#: Bytes of one listed task in a notice (id, partition, instant, JSON framing), at most.
_ENTRY_BYTES = 72
#: Tasks waiting to be told at most (while the store is slow): past it only their partitions
#: matter, which a few of them name as well as all.
MAX_PENDING = 20_000


def encode_soon(node_id: str, due: Sequence[Due], overflow: Iterable[int] = ()) -> str:
    """One payload under ``NOTICE_BYTES``: every task while they fit, else the partitions
    (each listed once; their owners read them again), with the ``overflow`` partitions of
    tasks no longer listed."""
    more = set(overflow)
    if not more and len(due) * _ENTRY_BYTES + 64 <= NOTICE_BYTES:
        return json.dumps({"node": node_id, "due": [[d.task_id, d.partition, d.at] for d in due]})
    partitions = sorted(more | {d.partition for d in due})
    payload = json.dumps({"node": node_id, "partitions": partitions})
    if len(payload) > NOTICE_BYTES:
        payload = json.dumps({"node": node_id, "partitions": "all"})
    return payload


def decode_soon(payload: str) -> tuple[str, list[Due], list[int] | None]:
    """(sending node, listed tasks, partitions to read again; None: all of them);
    ValueError if it is not one of ours."""
    doc = json.loads(payload)
    if not isinstance(doc, dict):
        raise ValueError("not a near-future notice")
    due: list[Due] = []
    for entry in doc.get("due", []):
        task_id, partition, at = entry
        if not (isinstance(task_id, str) and isinstance(partition, int) and isinstance(at, int)):
            raise ValueError("not a near-future notice")
        due.append(Due(task_id, partition, at))
    partitions = doc.get("partitions", [])
    if partitions == "all":
        return str(doc.get("node", "")), due, None
    if not isinstance(partitions, list) or not all(isinstance(p, int) for p in partitions):
        raise ValueError("not a near-future notice")
    return str(doc.get("node", "")), due, partitions


class SoonBroadcast:
    """Sends this node's near-future submits to the other nodes and hears theirs."""

    def __init__(
        self,
        notices: ReadyNotices,
        node_id: str,
        on_told: Callable[[list[Due], list[int] | None], None],
    ) -> None:
        self._notices = notices
        self.node_id = node_id
        self._on_told = on_told
        self._pending: list[Due] = []
        self._overflow: set[int] = set()  # partitions of tasks past MAX_PENDING
        self._flush: asyncio.Task[None] | None = None
        self._listening: Listening | None = None
        self.sent = 0
        self.heard = 0

    @property
    def listening(self) -> bool:
        return self._listening is not None and not self._listening.closed

    def publish(self, due: Iterable[Due]) -> None:
        """Queue near-future tasks of partitions this node does not own."""
        self._pending.extend(due)
        if len(self._pending) > MAX_PENDING:
            # Past this size the notice names partitions anyway: keep only those.
            self._overflow.update(d.partition for d in self._pending)
            self._pending = []
        if (self._pending or self._overflow) and (self._flush is None or self._flush.done()):
            self._flush = asyncio.get_running_loop().create_task(
                self._send(), name="chronoq-soon-publish"
            )

    async def _send(self) -> None:
        while self._pending or self._overflow:
            due, self._pending = self._pending, []
            overflow, self._overflow = self._overflow, set()
            payload = encode_soon(self.node_id, due, overflow)
            try:
                await self._notices.announce(SOON_CHANNEL, [payload])
                self.sent += 1
            except ChronoqError as exc:
                log.debug("near-future notice not sent (owners load them anyway): %s", exc)

    def _heard(self, payload: str) -> None:
        try:
            sender, due, partitions = decode_soon(payload)
        except (ValueError, TypeError):
            log.debug("ignored a malformed notice on %s", SOON_CHANNEL)
            return
        if sender != self.node_id:
            self.heard += 1
            self._on_told(due, partitions)

    async def keep_listening(self) -> None:
        """One pass of the listener loop: (re)open the listening connection if it is not up."""
        if self.listening:
            return
        if self._listening is not None:
            log.warning("lost the %s listening connection: reconnecting", SOON_CHANNEL)
            self._listening = None
        self._listening = await self._notices.listen(SOON_CHANNEL, self._heard)

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        if self._listening is not None:
            await self._listening.close()
            self._listening = None
