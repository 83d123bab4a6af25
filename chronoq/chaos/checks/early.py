"""``none_early``: no execution starts before its run_at, but for what a clock fault excuses."""

from __future__ import annotations

from chronoq.chaos.checks.clocks import clock_jumps, drift_excusable_ms, drifts_of
from chronoq.chaos.checks.verdict import US, Verdict, Violation
from chronoq.chaos.history import FaultRecord, History, TaskRow


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
    clocks = clock_jumps(history)
    drifts = [(f, d) for f, d in drifts_of(history) if d.peak_ms > 0]
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
                    and early <= drift_excusable_ms(f, d, checked) * 1000 + tol]
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
