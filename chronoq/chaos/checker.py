"""The checker: pure functions from a recorded ``History`` to a verdict.

Five checks, each a property chronoq promises, judged against records the scheduler did not
write itself (the client log, the workers' ledger, etcd's owner keys, the fault log):

``none_lost``
    Every accepted task ends SUCCEEDED (with a ledger entry of a successful run of its final
    attempt), DEAD with a reason, or CANCELLED when a cancel was asked for. An ambiguous
    submit may be absent; if present it is held to the same rule. Nothing runs or exists
    that no client submitted.
``none_early``
    No execution starts before its run_at (the original one, and a retry's backoff time),
    within ``clock_tolerance_s`` of timestamp rounding: the run is on one host, so every
    party reads one clock. Nodes hand their partitions off while their clock is off by more
    than ``max_clock_offset_ms`` (recorded in the history's meta) from the store's, so an
    early run during a clock jump is excused only up to that bound. Histories recorded
    before nodes checked their clocks (no such meta) excuse up to the jump's offset.
``duplicates_explained``
    An execution that follows one which did not fail on purpose is an extra one. Each needs
    an injected fault: a kill or pause of the worker that ran the earlier one, during it; or
    a node, PostgreSQL or clock fault overlapping the span from the earlier start to the
    extra start (a lost heartbeat or acknowledgement: a lease expiry, an ambiguous commit).
``failover_gaps``
    After a node fault, tasks of the partitions the node owned fire within the lease TTL plus
    a tick (plus ``failover_slack_s``: etcd's expiry lag, the claim and the fence write on a
    busy host). After a PostgreSQL or etcd fault, within the same bound from the heal.
``fencing``
    Per partition, in firing order, fencing tokens never go back; one node per token; the
    token is the one etcd issued to that node; none is above the store's final fence.
``execution_gap``
    The execution gap is the longest time during which some task was due (its run_at had
    passed) and no worker started any task. It is reported for every fault (the longest gap
    that overlaps the fault's window) and bounded (``exec_gap_bound_s``) for node kills and
    freezes: the other nodes keep firing, so workers with every node's address must keep
    starting tasks, whatever one node does.

Clock jumps: a node measures its clock against the store's and stops firing while it is off
by more than a small bound, so a jump of X costs no early run beyond that bound. A clock that
drifts crosses the bound between two measurements, so the node may fire until its next one
acts: an early run during a drift is excused up to the bound plus what the drift adds in a
measurement interval and a second (``Drift.excusable_ms``); what that node wrote as
``fired_at`` is corrected by the drift's offset at that time. Older
histories came from nodes that trusted their clock (a node X ahead ran tasks up to X early,
one X behind fired up to X late): the checker holds them to that (an early run beyond X, or
a gap beyond the bound plus X, still fails), and corrects the ``fired_at`` such a node wrote
with the tokens it held while skewed.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chronoq import stats
from chronoq.chaos.drift import Drift
from chronoq.chaos.history import (
    ACCEPTED,
    AMBIGUOUS,
    CANCELLED,
    ERROR,
    OK,
    REFUSED,
    REJECTED,
    Execution,
    FaultRecord,
    History,
    OwnerEvent,
    TaskRow,
)

CHECKS = (
    "none_lost", "none_early", "duplicates_explained", "failover_gaps", "fencing",
    "execution_gap",
)

# Fault kinds by what they may cause ("pause-node": the former name of freeze-node-past-ttl).
NODE_FREEZES = frozenset({"freeze-node", "freeze-node-past-ttl", "pause-node"})
FAILOVER = frozenset({"kill-node", "cut-node-etcd", "cut-node-postgres"}) | NODE_FREEZES
# Faults after which workers must keep starting tasks: the other nodes still fire.
EXEC_GAP_BOUNDED = frozenset({"kill-node"}) | NODE_FREEZES
GRACEFUL = frozenset({"clock-jump", "rolling-restart", "clock-drift"})
# A replicated store's faults (chronoq.embedded.ha): like restart-postgres, nobody can take
# over while the store fails over, and an ack that did not reach it may repeat a task.
STORE_FAILOVER = frozenset({"kill-pg-primary", "kill-pg-member", "switchover", "kill-pg-standby"})
# One store shard's postmaster killed: its partitions stop until it is back (nobody can take
# them over), an ack that did not reach it may repeat a task; the other shards' partitions
# keep firing (``shard_outages`` reports how late they fired during the outage).
SHARD_OUTAGE = frozenset({"kill-shard-primary"})
# A full disk under PostgreSQL: writes fail until space returns; nobody can take over.
INFRA = frozenset({"restart-postgres", "kill-etcd-member", "kill-etcd-leader", "disk-full"}) \
    | STORE_FAILOVER | SHARD_OUTAGE
WORKER = frozenset({"kill-worker", "pause-worker"})
# Every node's links slow and lossy (target "all nodes"): a reset PostgreSQL connection
# loses a heartbeat or the answer to a commit, as a restart does; etcd links explain none.
SLOW_STORE_LINKS = frozenset({"slow-links-postgres"})
# Faults that can make a task run twice without targeting its worker: a heartbeat or an
# acknowledgement that did not reach the store, so the lease expired.
DUPLICATE_CAUSES = FAILOVER | GRACEFUL | frozenset({"restart-postgres", "disk-full"}) \
    | STORE_FAILOVER | SLOW_STORE_LINKS | SHARD_OUTAGE
NOT_OWNER = frozenset({"submit", "retry", "requeue"})
TERMINAL = frozenset({"SUCCEEDED", "DEAD", "CANCELLED"})
US = 1_000_000


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    task_id: str | None = None


@dataclass(frozen=True)
class Duplicate:
    task_id: str
    earlier: Execution
    extra: Execution
    explanation: str | None  # None: unexplained


@dataclass(frozen=True)
class Gap:
    fault: int  # index in history.faults
    kind: str
    target: str
    start_us: int
    gap_s: float | None  # None: no task of those partitions came due in the window
    bound_s: float
    tasks: int

    @property
    def ok(self) -> bool:
        return self.gap_s is None or self.gap_s <= self.bound_s


@dataclass(frozen=True)
class ExecGap:
    """The longest execution gap that overlaps one fault's window."""

    fault: int  # index in history.faults
    kind: str
    target: str
    start_us: int  # when the gap began (None gap: the fault's start)
    gap_s: float | None  # None: no task was due and waiting during the fault
    bound_s: float | None  # None: reported, not bounded, for this kind of fault

    @property
    def ok(self) -> bool:
        return self.gap_s is None or self.bound_s is None or self.gap_s <= self.bound_s


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    exec_gaps: list[ExecGap] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def checks(self) -> dict[str, bool]:
        failed = {v.check for v in self.violations}
        return {c: c not in failed for c in CHECKS}

    @property
    def ok(self) -> bool:
        return not self.violations


def check(history: History) -> Verdict:
    """Run every check; the verdict lists each violation and the run's figures."""
    v = Verdict()
    rows = _rows_of(history)
    lost = check_none_lost(history, rows, v)
    early_ok, early_bad = check_none_early(history, rows, v)
    check_duplicates(history, v)
    check_gaps(history, v)
    check_execution_gaps(history, v)
    unverified = check_fencing(history, v)
    v.figures = _figures(history, rows, v, lost, early_ok, early_bad, unverified)
    return v


# ---------------------------------------------------------------------- none lost


def _rows_of(history: History) -> dict[str, TaskRow]:
    """The store row of each submit key (accepted or ambiguous) that reached the store."""
    by_id = {r.id: r for r in history.tasks}
    by_key = {r.key: r for r in history.tasks if r.key}
    out: dict[str, TaskRow] = {}
    for s in history.submits:
        row = by_id.get(s.task_id) if s.task_id else by_key.get(s.key)
        if row is not None:
            out[s.key] = row
    return out


def check_none_lost(history: History, rows: dict[str, TaskRow], v: Verdict) -> int:
    """Returns how many accepted tasks were lost (missing, or stuck before a final state)."""
    ok_runs = {(x.task_id, x.attempt) for x in history.executions if x.outcome == OK}
    cancels: dict[str, list[str]] = defaultdict(list)
    for c in history.cancels:
        cancels[c.key].append(c.outcome)
    lost = 0
    for s in history.submits:
        row = rows.get(s.key)
        if s.outcome == REJECTED:
            if row is not None:
                v.violations.append(Violation("none_lost", f"{s.key}: rejected, yet stored",
                                              row.id))
            continue
        if row is None:
            if s.outcome == ACCEPTED:
                lost += 1
                v.violations.append(Violation(
                    "none_lost", f"{s.key}: accepted as {s.task_id}, not in the store",
                    s.task_id))
            continue
        if row.state not in TERMINAL:
            lost += 1
            v.violations.append(Violation(
                "none_lost", f"{s.key}: ends {row.state} at attempt {row.attempt}, never "
                f"finished (last error: {row.last_error or '-'})", row.id))
            continue
        problem = _final_state_problem(row, cancels.get(s.key, []), ok_runs)
        if problem:
            v.violations.append(Violation("none_lost", f"{s.key}: {problem}", row.id))
    known = {r.id for r in rows.values()}
    submitted = {s.key for s in history.submits}
    for r in history.tasks:
        if r.key not in submitted:
            v.violations.append(Violation("none_lost", "a task no client submitted", r.id))
    for tid in sorted({x.task_id for x in history.executions} - known):
        v.violations.append(Violation("none_lost", "ran a task no client submitted", tid))
    return lost


def _final_state_problem(
    row: TaskRow, cancels: list[str], ok_runs: set[tuple[str, int]]
) -> str | None:
    if row.state == "SUCCEEDED":
        if CANCELLED in cancels:
            return "SUCCEEDED after a cancel was acknowledged"
        if (row.id, row.attempt) not in ok_runs:
            return f"SUCCEEDED, but no worker recorded a successful attempt {row.attempt}"
    elif row.state == "DEAD":
        if CANCELLED in cancels:
            return "DEAD after a cancel was acknowledged"
        if not row.last_error:
            return "DEAD without a reason"
    elif row.state == "CANCELLED" and not any(c in (CANCELLED, AMBIGUOUS) for c in cancels):
        return "CANCELLED, but no cancel was acknowledged" + (
            " (the cancel was refused)" if REFUSED in cancels else "")
    return None


# ---------------------------------------------------------------------- none early


def _clock_faults(history: History) -> list[FaultRecord]:
    return [f for f in history.faults if f.kind == "clock-jump" and "offset_ms" in f.detail]


def _drift_of(fault: FaultRecord) -> Drift | None:
    """The drift a clock-drift fault played (None for other faults, or an old record)."""
    d = fault.detail
    if fault.kind != "clock-drift" or not {"peak_ms", "rise_s", "fall_s"} <= d.keys():
        return None
    return Drift(int(d["peak_ms"]), rise_s=float(d["rise_s"]), fall_s=float(d["fall_s"]))


def _drifts(history: History) -> list[tuple[FaultRecord, Drift]]:
    return [(f, d) for f in history.faults if (d := _drift_of(f)) is not None]


def _drift_excusable_ms(fault: FaultRecord, drift: Drift, checked: int | None) -> float:
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
    for f in _clock_faults(history):
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


def _excusable_ms(fault: FaultRecord, checked: int | None) -> int:
    """How early a run may start during clock jump ``fault``: the jump itself, or at most the
    offset nodes tolerate before they stop firing."""
    offset = int(fault.detail["offset_ms"])
    return offset if checked is None else min(offset, int(checked))


def check_none_early(
    history: History, rows: dict[str, TaskRow], v: Verdict
) -> tuple[int, int]:
    """Returns (early runs excused by a clock jump, early runs not excused)."""
    p = history.params
    tol = round(p.clock_tolerance_s * US)
    slack = round(p.explain_slack_s * US)
    planned = {rows[s.key].id: s.run_at_us for s in history.submits if s.key in rows}
    clocks = _clock_faults(history)
    drifts = [(f, d) for f, d in _drifts(history) if d.peak_ms > 0]
    checked = history.meta.get("max_clock_offset_ms")  # None: nodes trusted their clocks
    excused = bad = 0
    for x in history.executions:
        due = max(x.run_at_us, planned.get(x.task_id, x.run_at_us))
        early = due - x.start_us
        if early <= tol:
            continue
        ahead = [f for f in clocks if int(f.detail["offset_ms"]) > 0
                 and f.start_us - slack <= x.start_us <= f.end_us + slack
                 and early <= _excusable_ms(f, checked) * 1000 + tol]
        drifting = [f for f, d in drifts
                    if f.start_us - slack <= x.start_us <= f.end_us + slack
                    and early <= _drift_excusable_ms(f, d, checked) * 1000 + tol]
        if ahead or drifting:
            excused += 1
            continue
        bad += 1
        v.violations.append(Violation(
            "none_early", f"attempt {x.attempt} started {early / 1000:.1f} ms before its "
            f"run_at on {x.worker}", x.task_id))
    for r in history.tasks:
        if r.fired_at_us is not None and r.fired_at_us < r.run_at_us - tol:
            bad += 1
            v.violations.append(Violation(
                "none_early", f"{r.fired_by} fired it {(r.run_at_us - r.fired_at_us) / 1000:.1f}"
                " ms before its run_at by its own clock", r.id))
    return excused, bad


# ---------------------------------------------------------------------- duplicates


def check_duplicates(history: History, v: Verdict) -> None:
    by_task: dict[str, list[Execution]] = defaultdict(list)
    for x in history.executions:
        by_task[x.task_id].append(x)
    for tid, runs in by_task.items():
        # By attempt, not start: a worker frozen between its claim and its handler starts
        # attempt n after attempt n+1 has run elsewhere; attempt n's lease is what expired.
        runs.sort(key=lambda x: (x.attempt, x.start_us))
        for earlier, extra in itertools.pairwise(runs):
            if earlier.outcome == ERROR:
                continue  # the handler failed on purpose: a planned retry
            why = explain(earlier, extra, history)
            v.duplicates.append(Duplicate(tid, earlier, extra, why))
            if why is None:
                v.violations.append(Violation(
                    "duplicates_explained",
                    f"attempt {extra.attempt} on {extra.worker} re-ran attempt "
                    f"{earlier.attempt} on {earlier.worker} (ended {earlier.outcome or 'never'})"
                    " with no injected fault to explain it", tid))


def explain(earlier: Execution, extra: Execution, history: History) -> str | None:
    """The injected fault that explains ``extra`` running after ``earlier``, or None."""
    slack = round(history.params.explain_slack_s * US)
    lo = min(earlier.start_us, extra.start_us) - slack
    hi = max(earlier.start_us, extra.start_us) + slack
    for f in history.faults:
        if f.kind in WORKER:
            if f.target != earlier.worker:
                continue
            what = "killed" if f.kind == "kill-worker" else "paused past its task lease"
            if f.start_us <= hi and f.end_us >= lo:
                return f"{f.kind} {f.target}: {what} mid-task"
        elif f.kind in DUPLICATE_CAUSES and f.start_us <= hi and f.end_us >= lo:
            return f"{f.kind} {f.target}: a heartbeat or acknowledgement did not land"
    return None


# ---------------------------------------------------------------------- failover gaps


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


def check_gaps(history: History, v: Verdict) -> None:
    p = history.params
    owners = Owners(history.owners)
    skew = skewed_tokens(history)
    drifts = _drifts(history)
    checked = history.meta.get("max_clock_offset_ms")
    tick = round(p.tick_s * US)
    fires = [(r, real_fired_at(r, skew, drifts)) for r in history.tasks
             if r.fire_token is not None and r.fired_by not in NOT_OWNER]
    everything = set(range(p.partitions))
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
        drift = _drift_of(f)
        if drift is not None and drift.peak_ms < 0:  # as far behind as it may fire
            behind = _drift_excusable_ms(f, drift, checked) / 1000
        bound = p.lease_ttl_s + p.tick_s + p.failover_slack_s + behind
        late = [
            max(0, fired - max(r.run_at_us, since)) / US
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


# ---------------------------------------------------------------------- execution gaps


def execution_gaps(history: History) -> list[tuple[int, int]]:
    """Every stretch (start, end) in µs with a task due and no execution starting in it.

    A task waits from its due time (the later of the planned run_at and the run_at its claim
    carried) to its start. Between two successive starts nothing starts, so the stretch
    there is from the later of the first start and the oldest due time among the tasks still
    waiting at the second start; each wait ends at a start, so those are the tasks that start
    at or after it: a suffix minimum over the starts in order.
    """
    rows = _rows_of(history)
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


# ---------------------------------------------------------------------- fencing


def check_fencing(history: History, v: Verdict) -> int:
    """Returns how many (partition, token) pairs etcd's record could not confirm."""
    skew = skewed_tokens(history)
    drifts = _drifts(history)
    issued: dict[tuple[int, int], str] = {
        (e.partition, e.token): e.owner
        for e in history.owners if e.owner is not None and e.token is not None
    }
    fires = sorted(
        ((r.partition, real_fired_at(r, skew, drifts) or 0, r) for r in history.tasks
         if r.fire_token is not None and r.fired_by not in NOT_OWNER),
        key=lambda t: (t[0], t[1]),
    )
    last: dict[int, TaskRow] = {}
    node_of: dict[tuple[int, int], str] = {}
    unverified: set[tuple[int, int]] = set()
    for part, _at, r in fires:
        token = r.fire_token
        assert token is not None
        prev = last.get(part)
        if prev is not None and prev.fire_token is not None and token < prev.fire_token:
            v.violations.append(Violation(
                "fencing", f"partition {part}: {r.fired_by} fired with token {token} after "
                f"{prev.fired_by} fired with token {prev.fire_token}", r.id))
        last[part] = r
        holder = node_of.setdefault((part, token), r.fired_by or "")
        if holder != r.fired_by:
            v.violations.append(Violation(
                "fencing", f"partition {part}: token {token} fired by {holder} and "
                f"{r.fired_by}", r.id))
        grantee = issued.get((part, token))
        if grantee is None:
            unverified.add((part, token))
        elif grantee != r.fired_by:
            v.violations.append(Violation(
                "fencing", f"partition {part}: etcd issued token {token} to {grantee}, "
                f"but {r.fired_by} fired with it", r.id))
        fence = history.fences.get(part)
        if fence is not None and token > fence:
            v.violations.append(Violation(
                "fencing", f"partition {part}: fired with token {token} above the store's "
                f"fence {fence}", r.id))
    return len(unverified)


# ---------------------------------------------------------------------- figures


def fire_lateness(history: History) -> list[tuple[int, float]]:
    """(run_at, seconds late) of every task an owner fired."""
    skew = skewed_tokens(history)
    drifts = _drifts(history)
    out = []
    for r in history.tasks:
        if r.fire_token is None or r.fired_by in NOT_OWNER:
            continue
        fired = real_fired_at(r, skew, drifts)
        if fired is not None:
            out.append((r.run_at_us, (fired - r.run_at_us) / US))
    return sorted(out)


def fault_effects(history: History) -> list[dict[str, Any]]:
    """What each fault did to the clients and to firing (figures, not checks): the tasks
    submitted during it, how many needed more than one call or stayed ambiguous (with the
    first error a client was told), how soon after the fault a submit was accepted again, and
    the firing lateness of the tasks due during it."""
    late = fire_lateness(history)
    runs_at = [t for t, _ in late]
    out = []
    for f in history.faults:
        sent = [x for x in history.submits if f.start_us <= x.sent_us <= f.end_us]
        retried = [x for x in sent if x.calls > 1]
        after = [x.answered_us for x in history.submits
                 if x.outcome == ACCEPTED and x.answered_us >= f.end_us]
        lo, hi = bisect.bisect_left(runs_at, f.start_us), bisect.bisect_right(runs_at, f.end_us)
        due = [s for _t, s in late[lo:hi]]
        out.append({
            "kind": f.kind, "target": f.target,
            "tasks_submitted": len(sent), "tasks_retried": len(retried),
            "tasks_ambiguous": sum(1 for x in sent if x.outcome == AMBIGUOUS),
            "first_error": next((x.error[:160] for x in retried if x.error), ""),
            "accepted_again_after_s": (min(after) - f.end_us) / US if after else None,
            "due": len(due),
            "fire_lateness_p99_s": stats.percentile(due, 99),
            "fire_lateness_max_s": max(due) if due else None,
        })
    return out


def shard_outages(history: History) -> list[dict[str, Any]]:
    """For each shard outage: the firing gap (the latest fire, from its ``run_at``) of the
    tasks due during it, on the shard that was down and on the surviving shards apart (a
    figure: the surviving ones should fire on time, the down one's wait for its return)."""
    fires = [(r, f) for r, f in (
        (r, real_fired_at(r, skewed_tokens(history), _drifts(history))) for r in history.tasks
        if r.fire_token is not None and r.fired_by not in NOT_OWNER) if f is not None]
    out = []
    for f in history.faults:
        if f.kind not in SHARD_OUTAGE or f.error:
            continue
        down = set(f.detail.get("partitions", ()))
        late: dict[bool, list[float]] = {True: [], False: []}
        for r, fired in fires:
            if f.start_us <= r.run_at_us <= f.end_us:
                late[r.partition in down].append(max(0, fired - r.run_at_us) / US)
        out.append({
            "target": f.target, "pid": f.detail.get("pid"),
            "outage_s": round((f.end_us - f.start_us) / US, 3),
            "writable_after_s": f.detail.get("writable_after_s"),
            "partitions_down": len(down),
            "partitions_surviving": history.params.partitions - len(down),
            "surviving_due": len(late[False]),
            "surviving_gap_s": max(late[False]) if late[False] else None,
            "surviving_lateness_p99_s": stats.percentile(late[False], 99),
            "down_due": len(late[True]),
            "down_gap_s": max(late[True]) if late[True] else None,
        })
    return out


def _figures(
    history: History, rows: dict[str, TaskRow], v: Verdict, lost: int, early_ok: int,
    early_bad: int, unverified: int,
) -> dict[str, Any]:
    outcomes = Counter(s.outcome for s in history.submits)
    states = Counter(r.state for r in rows.values())
    late = [s for _t, s in fire_lateness(history)]
    first_start: dict[str, int] = {}
    for x in history.executions:
        first_start[x.task_id] = min(first_start.get(x.task_id, x.start_us), x.start_us)
    exec_late = [(first_start[r.id] - s.run_at_us) / US for s in history.submits
                 if (r := rows.get(s.key)) is not None and r.id in first_start]
    explained = [d for d in v.duplicates if d.explanation is not None]
    failover = [g.gap_s for g in v.gaps if g.kind in FAILOVER and g.gap_s is not None]
    stretches = [(e - b) / US for b, e in execution_gaps(history)]
    exec_by_kind: dict[str, float] = {}
    for g in v.exec_gaps:
        if g.gap_s is not None:
            exec_by_kind[g.kind] = max(exec_by_kind.get(g.kind, 0.0), g.gap_s)
    return {
        "tasks": len(history.submits),
        "accepted": outcomes[ACCEPTED],
        "ambiguous": outcomes[AMBIGUOUS],
        "ambiguous_stored": sum(1 for s in history.submits
                                if s.outcome == AMBIGUOUS and s.key in rows),
        "rejected": outcomes[REJECTED],
        "final_states": dict(sorted(states.items())),
        "cancels": dict(Counter(c.outcome for c in history.cancels)),
        "executions": len(history.executions),
        "lost": lost,
        "early": early_bad,
        "early_under_clock_jump": early_ok,
        "duplicates": len(v.duplicates),
        "duplicates_explained": len(explained),
        "duplicates_unexplained": len(v.duplicates) - len(explained),
        "duplicate_causes": dict(Counter(
            (d.explanation or "unexplained").split(" ")[0] for d in v.duplicates)),
        "faults": dict(Counter(f.kind for f in history.faults)),
        "faults_failed": sum(1 for f in history.faults if f.error),
        "max_failover_gap_s": max(failover) if failover else None,
        "max_execution_gap_s": max(stretches) if stretches else None,
        "execution_gap_by_fault_kind": dict(sorted(exec_by_kind.items())),
        "fire_lateness_p50_s": stats.percentile(late, 50),
        "fire_lateness_p99_s": stats.percentile(late, 99),
        "fire_lateness_max_s": max(late) if late else None,
        "run_lateness_p50_s": stats.percentile(exec_late, 50),
        "run_lateness_p99_s": stats.percentile(exec_late, 99),
        "tokens_unverified": unverified,
        "violations": len(v.violations),
        "fault_effects": fault_effects(history),
        "shard_outages": shard_outages(history),
    }
