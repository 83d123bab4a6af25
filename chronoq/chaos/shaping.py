"""Link shaping for the chaos proxies: latency with jitter, a bandwidth cap, connection resets.

Pure: a ``Shaper`` turns "this many bytes arrived now" into "deliver them then", for one
direction of one connection, the way a slow link does: the bytes leave at the link's rate
after the ones before them, arrive after the latency (jittered), and never overtake each other
(TCP delivers in order). ``lifetime`` draws how long a connection lives before the link resets
it. The proxy (``chaos/proxy.py``) does the waiting, the writing and the resetting.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkShape:
    """How bad a link is. Defaults: a congested WAN path on a 2-core host's loopback, slow
    enough to be felt (tens of ms per round trip, a few resets per minute) yet under the lease
    TTL, so it tests lateness and reconnects rather than failover."""

    latency_s: float = 0.030  # one way
    jitter_s: float = 0.020  # each chunk's latency is latency ± jitter (uniform), never < 0
    bandwidth_bps: float = 512 * 1024  # bytes per second, each direction of each connection
    mean_life_s: float | None = 8.0  # mean time until a connection is reset; None: never

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.jitter_s < 0:
            raise ValueError("latency and jitter must not be negative")
        if self.bandwidth_bps <= 0:
            raise ValueError("the bandwidth cap must be positive")
        if self.mean_life_s is not None and self.mean_life_s <= 0:
            raise ValueError("the mean connection lifetime must be positive (or None)")


class Shaper:
    """One direction of one connection through a shaped link."""

    def __init__(self, shape: LinkShape, rng: random.Random) -> None:
        self.shape = shape
        self._rng = rng
        self._free_at = 0.0  # when the link has sent every byte given so far
        self._last_delivery = 0.0

    def delivery(self, now: float, nbytes: int) -> float:
        """When ``nbytes`` that arrived at ``now`` reach the other side (same time base)."""
        s = self.shape
        sent = max(now, self._free_at) + nbytes / s.bandwidth_bps
        self._free_at = sent
        latency = max(0.0, s.latency_s + self._rng.uniform(-s.jitter_s, s.jitter_s))
        at = max(sent + latency, self._last_delivery)  # in order, like TCP
        self._last_delivery = at
        return at


def lifetime(shape: LinkShape, rng: random.Random) -> float | None:
    """Seconds until the link resets a connection (exponential: resets come at random), or
    None when this shape does not reset."""
    if shape.mean_life_s is None:
        return None
    return rng.expovariate(1.0 / shape.mean_life_s)
