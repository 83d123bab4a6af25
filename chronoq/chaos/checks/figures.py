"""A run's figures (not checks): lateness, what each fault did to clients and firing, shard
outages, and the verdict's totals."""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

from chronoq import stats
from chronoq.chaos.checks.causes import FAILOVER, NOT_OWNER, SHARD_MOVE, SHARD_OUTAGE
from chronoq.chaos.checks.clocks import drifts_of, real_fired_at, skewed_tokens
from chronoq.chaos.checks.gaps import execution_gaps
from chronoq.chaos.checks.verdict import US, Verdict
from chronoq.chaos.history import ACCEPTED, AMBIGUOUS, REJECTED, History, TaskRow


def fire_lateness(history: History) -> list[tuple[int, float]]:
    """(run_at, seconds late) of every task an owner fired."""
    skew = skewed_tokens(history)
    drifts = drifts_of(history)
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
        (r, real_fired_at(r, skewed_tokens(history), drifts_of(history))) for r in history.tasks
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


def shard_moves(history: History) -> list[dict[str, Any]]:
    """For each move of partitions: the firing gap (the latest fire, from its ``run_at``) of
    the moved partitions' tasks due while the move ran, and the lateness of the others."""
    fires = [(r, f) for r, f in (
        (r, real_fired_at(r, skewed_tokens(history), drifts_of(history))) for r in history.tasks
        if r.fire_token is not None and r.fired_by not in NOT_OWNER) if f is not None]
    out = []
    for f in history.faults:
        if f.kind not in SHARD_MOVE or f.error:
            continue
        moved = set(f.detail.get("partitions", ()))
        late: dict[bool, list[float]] = {True: [], False: []}
        for r, fired in fires:
            if f.start_us <= r.run_at_us <= f.end_us:
                late[r.partition in moved].append(max(0, fired - r.run_at_us) / US)
        out.append({
            "target": f.target, "move_id": f.detail.get("move_id"),
            "outcome": f.detail.get("outcome"), "killed": f.detail.get("killed"),
            "killed_in": f.detail.get("killed_in"),
            "partitions_moved": len(moved),
            "move_s": round((f.end_us - f.start_us) / US, 3),
            "moved_due": len(late[True]),
            "moved_gap_s": max(late[True]) if late[True] else None,
            "others_due": len(late[False]),
            "others_lateness_p99_s": stats.percentile(late[False], 99),
        })
    return out


def figures(
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
        "shard_moves": shard_moves(history),
    }
