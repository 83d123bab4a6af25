"""Near-future submits reach their owner's timing wheel at once, whichever node took them.

A task submitted for the next seconds on a node that does not own its partition would wait
for its owner's next load (up to a quarter of the wheel's horizon). Instead the submitting
node sends, after the insert committed, one NOTIFY on ``SOON_CHANNEL`` per batch of such
tasks: their ids, partitions and instants while they fit in one notice, else only the
partitions, which their owners then read again (one statement). Notices go out at once, and
while one is in flight the next ones gather into a single NOTIFY, so a busy node sends about
one per round trip, never one per task (``chronoq.node.dispatch.broadcast``). Delivery is
best effort: a lost notice costs the owner's next load, never a task.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

from chronoq.node.dispatch.broadcast import NOTICE_BYTES, Broadcast
from chronoq.store.port import Notices
from chronoq.wheel import Due

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


class SoonBroadcast(Broadcast[tuple[list[Due], list[int] | None]]):
    """Sends this node's near-future submits to the other nodes and hears theirs."""

    channel = SOON_CHANNEL

    def __init__(
        self,
        notices: Notices,
        node_id: str,
        on_told: Callable[[list[Due], list[int] | None], None],
    ) -> None:
        super().__init__(notices, node_id)
        self._on_told = on_told
        self._pending: list[Due] = []
        self._overflow: set[int] = set()  # partitions of tasks past MAX_PENDING

    def publish(self, due: Iterable[Due]) -> None:
        """Queue near-future tasks of partitions this node does not own."""
        self._pending.extend(due)
        if len(self._pending) > MAX_PENDING:
            # Past this size the notice names partitions anyway: keep only those.
            self._overflow.update(d.partition for d in self._pending)
            self._pending = []
        self._send_soon()

    def _has_pending(self) -> bool:
        return bool(self._pending or self._overflow)

    def _take_payloads(self) -> list[str]:
        due, self._pending = self._pending, []
        overflow, self._overflow = self._overflow, set()
        return [encode_soon(self.node_id, due, overflow)]

    def _decode(self, payload: str) -> tuple[str, tuple[list[Due], list[int] | None]]:
        sender, due, partitions = decode_soon(payload)
        return sender, (due, partitions)

    def _deliver(self, body: tuple[list[Due], list[int] | None]) -> None:
        self._on_told(*body)
