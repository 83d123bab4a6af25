"""The injected clock faults, and the instants of fires corrected for them: a node whose
clock was pushed ahead wrote ``fired_at`` by that clock."""

from __future__ import annotations

from collections.abc import Sequence

from chronoq.chaos.checks.verdict import US
from chronoq.chaos.drift import Drift
from chronoq.chaos.history import FaultRecord, History, TaskRow


def clock_jumps(history: History) -> list[FaultRecord]:
    return [f for f in history.faults if f.kind == "clock-jump" and "offset_ms" in f.detail]


def drift_of(fault: FaultRecord) -> Drift | None:
    """The drift a clock-drift fault played (None for other faults, or an old record)."""
    d = fault.detail
    if fault.kind != "clock-drift" or not {"peak_ms", "rise_s", "fall_s"} <= d.keys():
        return None
    return Drift(int(d["peak_ms"]), rise_s=float(d["rise_s"]), fall_s=float(d["fall_s"]))


def drifts_of(history: History) -> list[tuple[FaultRecord, Drift]]:
    return [(f, d) for f in history.faults if (d := drift_of(f)) is not None]


def drift_excusable_ms(fault: FaultRecord, drift: Drift, checked: int | None) -> float:
    return drift.excusable_ms(checked, float(fault.detail.get("check_interval_s", 2.0)))


def drift_correction(row: TaskRow, drifts: Sequence[tuple[FaultRecord, Drift]]) -> int:
    """µs that a drifting node's clock was ahead when it wrote ``row.fired_at``."""
    if row.fired_at_us is None:
        return 0
    for f, d in drifts:
        if row.fired_by != f.target:
            continue
        written = (row.fired_at_us - f.start_us) / US  # by the node's clock
        if not 0 < written < d.duration_s + abs(d.peak_ms) / 1000:
            continue
        offset = d.offset_ms(written)
        for _ in range(3):  # real = written - offset(real): a few fixed-point steps
            offset = d.offset_ms(written - offset / 1000)
        return round(offset * 1000)
    return 0


def skewed_tokens(history: History) -> dict[tuple[int, int], int]:
    """(partition, token) → the clock offset (µs) of the node that fired with it.

    A clock jump restarts its node with the offset and, at the end, restarts it again
    without: the skewed incarnation is the one that claimed partitions after the jump began
    and released them in the last release burst of the fault's window. Tokens the node was
    issued in between are the ones it fired with a skewed clock.
    """
    out: dict[tuple[int, int], int] = {}
    events = sorted(history.owners, key=lambda e: e.at_us)
    for f in clock_jumps(history):
        off = int(f.detail["offset_ms"]) * 1000
        holder: dict[int, str | None] = {}
        released = f.start_us
        for e in events:
            if f.start_us <= e.at_us <= f.end_us and e.owner is None \
                    and holder.get(e.partition) == f.target:
                released = max(released, e.at_us)
            holder[e.partition] = e.owner
        for e in events:
            if (e.owner == f.target and e.token is not None
                    and f.start_us <= e.at_us < released):
                out[(e.partition, e.token)] = off
    return out


def real_fired_at(
    row: TaskRow, skew: dict[tuple[int, int], int],
    drifts: Sequence[tuple[FaultRecord, Drift]] = (),
) -> int | None:
    """``fired_at`` corrected for an injected clock offset of the node that wrote it."""
    if row.fired_at_us is None:
        return None
    if row.fire_token is None:
        return row.fired_at_us
    fixed = skew.get((row.partition, row.fire_token), 0)
    return row.fired_at_us - fixed - drift_correction(row, drifts)
