"""Which node gets the next call: round robin over the nodes that look best right now.

A client of several nodes keeps one view per node: what its health stream last said, and
whether a call to it recently failed or hung (the node is *suspect* for a while). Calls go
round robin over the best nodes; a node that answers NOT_SERVING, stopped answering or just
failed a call gets no new calls while a better one exists. When every node looks bad the
client still tries the least bad one rather than failing on its own. Pure: the caller passes
the monotonic time and feeds in what it observes.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass

#: How long a node whose call failed or hung is passed over (unless nothing better exists):
#: long enough for keepalive to close a frozen node's connection and for its health stream
#: to say so, short enough that a node which had a hiccup is back in rotation at once.
SUSPECT_SECONDS = 3.0


class NodeHealth(enum.IntEnum):
    """What the client knows of a node, best first (the value orders the choice)."""

    SERVING = 0
    UNKNOWN = 1  # not heard from yet, or the node has no health service
    NOT_SERVING = 2  # answers, but says it should not get traffic
    UNREACHABLE = 3  # its health stream broke: dead, frozen or cut off


@dataclass
class NodeView:
    address: str
    health: NodeHealth = NodeHealth.UNKNOWN
    suspect_until: float = 0.0


class Picker:
    """Round robin over the best nodes; see the module docstring for what "best" means."""

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("a picker needs at least one address")
        self.nodes = [NodeView(a) for a in addresses]
        self._last = len(self.nodes) - 1  # the first pick is node 0

    def rank(self, index: int, now: float) -> tuple[bool, NodeHealth]:
        """Lower is better: not suspect before suspect, then by health."""
        node = self.nodes[index]
        return (node.suspect_until > now, node.health)

    def pick(self, now: float, avoid: Collection[int] = ()) -> int:
        """The next node after the last one picked among the best ranked; nodes in ``avoid``
        (already tried for this call) only when there is no other."""
        indices = [i for i in range(len(self.nodes)) if i not in avoid] or list(
            range(len(self.nodes))
        )
        best = min(self.rank(i, now) for i in indices)
        candidates = [i for i in indices if self.rank(i, now) == best]
        after = [i for i in candidates if i > self._last]
        chosen = after[0] if after else candidates[0]
        self._last = chosen
        return chosen

    def set_health(self, index: int, health: NodeHealth) -> None:
        self.nodes[index].health = health

    def failed(self, index: int, now: float) -> None:
        """A call to the node failed or hung: pass it over for ``SUSPECT_SECONDS``."""
        self.nodes[index].suspect_until = now + SUSPECT_SECONDS

    def answered(self, index: int) -> None:
        """A call to the node succeeded: it is no longer suspect."""
        self.nodes[index].suspect_until = 0.0
