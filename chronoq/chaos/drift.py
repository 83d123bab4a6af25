"""A clock that drifts: the chaos clock-drift fault's offset over time (pure).

A clock jump moves a node's clock at once; a drifting clock moves it a little at a time (a
bad oscillator, a stopped time daemon), so it crosses the nodes' clock-offset bound between
two of their measurements, not at a restart. ``Drift`` is the offset's shape: it grows
steadily from 0 to ``peak_ms`` over ``rise_s``, then returns to 0 over ``fall_s`` (a time
daemon slewing it back). The injector writes ``offset_ms(elapsed)`` to the node's offset file
as time goes by; the checker uses the same shape to judge and to correct what the node did.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds a node may take, beyond its measurement interval, to act on a clock it found off
#: (the measurement's round trips, then suspending its ownership).
ACT_S = 1.0


@dataclass(frozen=True)
class Drift:
    peak_ms: int  # > 0: the clock runs ahead; < 0: behind
    rise_s: float
    fall_s: float

    def __post_init__(self) -> None:
        if self.rise_s <= 0 or self.fall_s <= 0:
            raise ValueError("a drift rises and falls over a positive time")

    @property
    def duration_s(self) -> float:
        return self.rise_s + self.fall_s

    @property
    def rate_ms_per_s(self) -> float:
        """How fast the offset grows while it rises (the faster fall only brings it back)."""
        return abs(self.peak_ms) / self.rise_s

    def offset_ms(self, elapsed_s: float) -> float:
        """The clock's offset ``elapsed_s`` after the drift began (0 before and after)."""
        if elapsed_s <= 0 or elapsed_s >= self.duration_s:
            return 0.0
        if elapsed_s <= self.rise_s:
            return self.peak_ms * elapsed_s / self.rise_s
        return self.peak_ms * (self.duration_s - elapsed_s) / self.fall_s

    def excusable_ms(self, bound_ms: int | None, check_interval_s: float) -> float:
        """How far off the node's clock can be while it still fires: the bound, plus what the
        drift adds until the node's next measurement acts on it; without a checked bound
        (None or 0), the whole peak."""
        if not bound_ms:
            return float(abs(self.peak_ms))
        late = self.rate_ms_per_s * (check_interval_s + ACT_S)
        return min(float(abs(self.peak_ms)), bound_ms + late)
