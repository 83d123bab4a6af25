"""``none_lost``: every accepted task ends in a final state its records explain."""

from __future__ import annotations

from collections import defaultdict

from chronoq.chaos.checks.verdict import Verdict, Violation
from chronoq.chaos.history import (
    ACCEPTED,
    AMBIGUOUS,
    CANCELLED,
    OK,
    REFUSED,
    REJECTED,
    History,
    TaskRow,
)

TERMINAL = frozenset({"SUCCEEDED", "DEAD", "CANCELLED"})


def rows_of(history: History) -> dict[str, TaskRow]:
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
