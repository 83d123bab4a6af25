"""``duplicates_explained``: every extra execution has an injected fault to explain it."""

from __future__ import annotations

import itertools
from collections import defaultdict

from chronoq.chaos.checks.causes import DUPLICATE_CAUSES, WORKER
from chronoq.chaos.checks.verdict import US, Duplicate, Verdict, Violation
from chronoq.chaos.history import ERROR, Execution, History


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
