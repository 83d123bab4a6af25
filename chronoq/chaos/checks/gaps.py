"""``failover_gaps`` and ``execution_gap``: how long firing, and then starting tasks, stopped
around each fault."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence

from chronoq.chaos.checks.causes import EXEC_GAP_BOUNDED, INFRA, NOT_OWNER, SHARD_OUTAGE, WORKER
from chronoq.chaos.checks.clocks import (
    drift_excusable_ms,
    drift_of,
    drifts_of,
    real_fired_at,
    skewed_tokens,
)
from chronoq.chaos.checks.lost import rows_of
from chronoq.chaos.checks.verdict import US, ExecGap, Gap, Verdict, Violation
from chronoq.chaos.history import History, OwnerEvent


class Owners:
    """Who owned each partition when, from the observer's owner events."""

    def __init__(self, events: Sequence[OwnerEvent]) -> None:
        self._times: dict[int, list[int]] = defaultdict(list)
        self._owners: dict[int, list[str | None]] = defaultdict(list)
        for e in sorted(events, key=lambda e: e.at_us):
            self._times[e.partition].append(e.at_us)
            self._owners[e.partition].append(e.owner)

    def at(self, partition: int, at_us: int) -> str | None:
        i = bisect.bisect_right(self._times[partition], at_us)
        return self._owners[partition][i - 1] if i else None

    def of(self, node: str, at_us: int, partitions: int) -> set[int]:
        return {p for p in range(partitions) if self.at(p, at_us) == node}


def outages(history: History) -> list[tuple[int, int, frozenset[int] | None]]:
    """(start, heal, partitions or None for all) of each fault that stops the store or etcd:
    while one lasts nobody can fire (or take over) the partitions it stops."""
    out = []
    for f in history.faults:
        if f.kind not in INFRA or f.error:
            continue
        shard = f.detail.get("partitions") if f.kind in SHARD_OUTAGE else None
        out.append((f.start_us, f.end_us, None if shard is None else frozenset(shard)))
    return sorted(out, key=lambda o: o[0])


def fire_from(
    partition: int,
    due_us: int,
    bound_us: int,
    stops: Sequence[tuple[int, int, frozenset[int] | None]],
) -> int:
    """When a fault's bound starts to count for a task due at ``due_us``: at its due time,
    or at the heal of a store or etcd outage of its partition that began before it was late
    (chained: an outage that begins within the bound after a heal moves it again). A fault
    stacked on an outage cannot hand the partition over before the outage heals."""
    since = due_us
    for start, heal, parts in stops:
        if start > since + bound_us:
            break
        if heal > since and (parts is None or partition in parts):
            since = heal
    return since


def check_gaps(history: History, v: Verdict) -> None:
    p = history.params
    owners = Owners(history.owners)
    skew = skewed_tokens(history)
    drifts = drifts_of(history)
    checked = history.meta.get("max_clock_offset_ms")
    tick = round(p.tick_s * US)
    fires = [(r, real_fired_at(r, skew, drifts)) for r in history.tasks
             if r.fire_token is not None and r.fired_by not in NOT_OWNER]
    everything = set(range(p.partitions))
    stops = outages(history)
    for i, f in enumerate(history.faults):
        if f.kind in WORKER or f.error:
            continue
        if f.kind in INFRA:
            parts, since = everything, f.end_us  # nothing can take over: judge from the heal
        elif f.target == "all nodes":
            parts, since = everything, 0
        else:
            parts, since = owners.of(f.target, f.start_us, p.partitions), 0
        # A node whose clock is behind fires that much late by design (it trusts its clock).
        behind = max(0, -int(f.detail.get("offset_ms", 0))) / 1000
        drift = drift_of(f)
        if drift is not None and drift.peak_ms < 0:  # as far behind as it may fire
            behind = drift_excusable_ms(f, drift, checked) / 1000
        bound = p.lease_ttl_s + p.tick_s + p.failover_slack_s + behind
        wait = round(bound * US)
        late = [
            max(0, fired - fire_from(r.partition, max(r.run_at_us, since), wait, stops)) / US
            for r, fired in fires
            if fired is not None and r.partition in parts
            and f.start_us - tick <= r.run_at_us <= f.end_us
        ]
        gap = Gap(i, f.kind, f.target, f.start_us, max(late) if late else None, bound, len(late))
        v.gaps.append(gap)
        if not gap.ok:
            v.violations.append(Violation(
                "failover_gaps", f"{f.kind} {f.target}: the {len(parts)} partitions it held "
                f"fired {gap.gap_s:.2f} s late (bound {bound:.2f} s: TTL + tick + slack)"))




def execution_gaps(history: History) -> list[tuple[int, int]]:
    """Every stretch (start, end) in µs with a task due and no execution starting in it.

    A task waits from its due time (the later of the planned run_at and the run_at its claim
    carried) to its start. Between two successive starts nothing starts, so the stretch
    there is from the later of the first start and the oldest due time among the tasks still
    waiting at the second start; each wait ends at a start, so those are the tasks that start
    at or after it: a suffix minimum over the starts in order.
    """
    rows = rows_of(history)
    planned = {rows[s.key].id: s.run_at_us for s in history.submits if s.key in rows}
    runs = sorted(
        (x.start_us, max(x.run_at_us, planned.get(x.task_id, x.run_at_us)))
        for x in history.executions
    )
    out: list[tuple[int, int]] = []
    oldest = math.inf
    for i in range(len(runs) - 1, -1, -1):
        start, due = runs[i]
        oldest = min(oldest, due)
        previous = runs[i - 1][0] if i else history.started_us
        begin = max(previous, int(oldest)) if oldest < start else start
        if begin < start:
            out.append((begin, start))
    out.reverse()
    return out


def check_execution_gaps(history: History, v: Verdict) -> None:
    """The longest execution gap overlapping each fault; bounded for node kills and freezes."""
    p = history.params
    stretches = execution_gaps(history)
    settle = round(p.explain_slack_s * US)
    for i, f in enumerate(history.faults):
        if f.error:
            continue
        hit = [(b, e) for b, e in stretches if b <= f.end_us + settle and e >= f.start_us]
        begin, end = max(hit, key=lambda g: g[1] - g[0]) if hit else (f.start_us, f.start_us)
        bound = p.exec_gap_bound_s if f.kind in EXEC_GAP_BOUNDED else None
        gap = ExecGap(i, f.kind, f.target, begin, (end - begin) / US if hit else None, bound)
        v.exec_gaps.append(gap)
        if not gap.ok:
            v.violations.append(Violation(
                "execution_gap", f"{f.kind} {f.target}: no worker started a task for "
                f"{gap.gap_s:.2f} s while tasks were due (bound {bound:.2f} s)"))
