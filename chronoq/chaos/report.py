"""The chaos report: a terminal summary (rich), a JSON report and a Jepsen-style timeline.

The timeline (PNG, matplotlib's Agg backend, no display needed) puts firing lateness and
throughput over time on one axis of seconds since the run began, with each injected fault's
window shaded and labelled, so a gap or a spike lines up with the fault that caused it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from chronoq.chaos.checker import CHECKS, ExecGap, Gap, Verdict, fire_lateness
from chronoq.chaos.history import History

US = 1_000_000
SHOWN_VIOLATIONS = 20


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return str(value)


def summary_table(verdict: Verdict) -> Table:
    f = verdict.figures
    table = Table(title="chaos run", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value")
    rows = [
        ("tasks (accepted / ambiguous / rejected)",
         f"{f['tasks']} ({f['accepted']} / {f['ambiguous']} / {f['rejected']})"),
        ("final states", _fmt(f["final_states"])),
        ("executions", _fmt(f["executions"])),
        ("faults injected", _fmt(f["faults"])),
        ("lost", _fmt(f["lost"])),
        ("early (excused by a clock jump)",
         f"{f['early']} ({f['early_under_clock_jump']})"),
        ("duplicates explained / unexplained",
         f"{f['duplicates_explained']} / {f['duplicates_unexplained']}"),
        ("duplicate causes", _fmt(f["duplicate_causes"])),
        ("max failover gap (s)", _fmt(f["max_failover_gap_s"])),
        ("max execution gap (s): run / by fault",
         f"{_fmt(f.get('max_execution_gap_s'))} / "
         f"{_fmt(f.get('execution_gap_by_fault_kind'))}"),
        ("fire lateness p50 / p99 / max (s)",
         f"{_fmt(f['fire_lateness_p50_s'])} / {_fmt(f['fire_lateness_p99_s'])} / "
         f"{_fmt(f['fire_lateness_max_s'])}"),
        ("run lateness p50 / p99 (s)",
         f"{_fmt(f['run_lateness_p50_s'])} / {_fmt(f['run_lateness_p99_s'])}"),
    ]
    for outage in f.get("shard_outages") or []:
        rows.append((
            f"shard outage {outage['target']} ({outage['outage_s']} s): firing gap of "
            "surviving / down partitions (s)",
            f"{_fmt(outage['surviving_gap_s'])} ({outage['partitions_surviving']} partitions, "
            f"{outage['surviving_due']} due) / {_fmt(outage['down_gap_s'])} "
            f"({outage['partitions_down']} partitions, {outage['down_due']} due)",
        ))
    for move in f.get("shard_moves") or []:
        killed = f", driver {move['killed']} killed in {move['killed_in']}" if move.get(
            "killed") else ""
        rows.append((
            f"move {move['target']} of {move['partitions_moved']} partitions "
            f"({move['outcome']}{killed}): firing gap of moved partitions / others p99 (s)",
            f"{_fmt(move['moved_gap_s'])} ({move['moved_due']} due) / "
            f"{_fmt(move['others_lateness_p99_s'])} ({move['others_due']} due)",
        ))
    for name, value in rows:
        table.add_row(name, value)
    for name, passed in verdict.checks.items():
        table.add_row(f"check {name}", "[green]pass[/green]" if passed else "[red]FAIL[/red]")
    return table


def faults_table(history: History, verdict: Verdict) -> Table:
    gaps = {g.fault: g for g in verdict.gaps}
    exec_gaps = {g.fault: g for g in verdict.exec_gaps}
    effects = verdict.figures.get("fault_effects") or []
    table = Table(title="faults")
    for col in ("t (s)", "fault", "target", "lasted (s)", "failover gap (s)",
                "execution gap (s)", "effect", "detail"):
        table.add_column(col)
    for i, f in enumerate(history.faults):
        detail = {k: v for k, v in f.detail.items() if k != "hold_s"}
        table.add_row(
            f"{(f.start_us - history.started_us) / US:.1f}", f.kind, f.target,
            f"{(f.end_us - f.start_us) / US:.1f}", _gap_cell(gaps.get(i)),
            _gap_cell(exec_gaps.get(i)),
            _effect_cell(effects[i] if i < len(effects) else None),
            (f"[red]{f.error}[/red] " if f.error else "") + _fmt(detail),
        )
    return table


def _effect_cell(e: dict[str, Any] | None) -> str:
    """Submits retried of those sent during the fault, and the p99 lateness of what was due."""
    if not e:
        return "-"
    cell = f"retried {e['tasks_retried']}/{e['tasks_submitted']}"
    if e.get("fire_lateness_p99_s") is not None:
        cell += f", late p99 {e['fire_lateness_p99_s']:.2f} s"
    return cell


def _gap_cell(g: Gap | ExecGap | None) -> str:
    if g is None or g.gap_s is None:
        return "-"
    return f"{g.gap_s:.2f}" if g.ok else f"[red]{g.gap_s:.2f}[/red]"


def print_report(history: History, verdict: Verdict, console: Console) -> None:
    console.print(faults_table(history, verdict))
    console.print(summary_table(verdict))
    for v in verdict.violations[:SHOWN_VIOLATIONS]:
        console.print(f"[red]✗ {v.check}[/red] {v.task_id or ''} {v.detail}")
    if len(verdict.violations) > SHOWN_VIOLATIONS:
        console.print(f"[red]… and {len(verdict.violations) - SHOWN_VIOLATIONS} more "
                      "(see report.json)[/red]")
    console.print("[green]all checks passed[/green]" if verdict.ok
                  else f"[red]{len(verdict.violations)} violations[/red]")


def report_json(history: History, verdict: Verdict) -> dict[str, Any]:
    return {
        "ok": verdict.ok,
        "checks": verdict.checks,
        "figures": verdict.figures,
        "violations": [v.__dict__ for v in verdict.violations],
        "gaps": [{**g.__dict__, "ok": g.ok} for g in verdict.gaps],
        "exec_gaps": [{**g.__dict__, "ok": g.ok} for g in verdict.exec_gaps],
        "duplicates": [
            {"task": d.task_id, "earlier": f"{d.earlier.worker}#{d.earlier.attempt}",
             "extra": f"{d.extra.worker}#{d.extra.attempt}", "explanation": d.explanation}
            for d in verdict.duplicates
        ],
        "faults": [f.__dict__ for f in history.faults],
        "params": history.params.__dict__,
        "meta": history.meta,
        "check_names": list(CHECKS),
    }


def write_json(path: Path, history: History, verdict: Verdict) -> None:
    path.write_text(json.dumps(report_json(history, verdict), indent=2, default=str))


COLORS = {
    "kill-node": "tab:red", "freeze-node": "tab:orange", "freeze-node-past-ttl": "tab:orange",
    "pause-node": "tab:orange", "kill-worker": "tab:purple",
    "pause-worker": "tab:pink", "kill-etcd-member": "tab:olive",
    "kill-etcd-leader": "tab:green", "restart-postgres": "tab:brown",
    "cut-node-etcd": "tab:cyan", "cut-node-postgres": "tab:blue",
    "clock-jump": "gold", "rolling-restart": "tab:gray",
    "disk-full": "saddlebrown", "slow-links-etcd": "lightseagreen",
    "slow-links-postgres": "steelblue", "clock-drift": "khaki",
}


def plot_timeline(path: Path, history: History, verdict: Verdict) -> None:
    """Firing lateness (top) and throughput (bottom) over time, fault windows shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = history.started_us
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    late = fire_lateness(history)
    top.scatter([(t - t0) / US for t, _ in late], [s for _, s in late], s=3,
                color="tab:blue", label="fire lateness (fired_at - run_at)")
    first: dict[str, int] = {}
    for x in history.executions:
        first.setdefault(x.task_id, x.start_us)
    runs = [((x.run_at_us - t0) / US, (first[x.task_id] - x.run_at_us) / US)
            for x in history.executions if first.get(x.task_id) == x.start_us]
    top.scatter([a for a, _ in runs], [b for _, b in runs], s=2, color="tab:green",
                alpha=0.4, label="run lateness (first start - run_at)")
    bad = [d.extra for d in verdict.duplicates if d.explanation is None]
    if bad:
        top.scatter([(x.start_us - t0) / US for x in bad], [0.0] * len(bad), marker="x",
                    color="red", s=40, label="unexplained duplicate")
    top.set_ylabel("seconds late")
    top.set_yscale("symlog", linthresh=0.1)
    _throughput(bottom, history)
    for ax in (top, bottom):
        _shade(ax, history)
    top.legend(loc="upper left", fontsize=8)
    bottom.legend(loc="upper left", fontsize=8)
    bottom.set_xlabel("seconds since the run began (by run_at above, by event below)")
    status = "PASS" if verdict.ok else f"FAIL ({len(verdict.violations)} violations)"
    fig.suptitle(f"chronoq chaos: {verdict.figures.get('tasks', 0)} tasks, "
                 f"{len(history.faults)} faults, {status}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput(ax: Any, history: History) -> None:
    t0 = history.started_us
    fired = Counter(int((r.fired_at_us - t0) // US) for r in history.tasks
                    if r.fired_at_us is not None)
    ran = Counter(int((x.start_us - t0) // US) for x in history.executions)
    span = range(max([0, *fired, *ran]) + 1)
    ax.step(span, [fired.get(s, 0) for s in span], where="post", label="fired / s")
    ax.step(span, [ran.get(s, 0) for s in span], where="post", label="started / s")
    ax.set_ylabel("tasks per second")


def _shade(ax: Any, history: History) -> None:
    t0 = history.started_us
    top = ax.get_ylim()[1]
    for f in history.faults:
        a, b = (f.start_us - t0) / US, (f.end_us - t0) / US
        ax.axvspan(a, max(b, a + 0.2), color=COLORS.get(f.kind, "gray"), alpha=0.18, lw=0)
        if ax.get_subplotspec().is_first_row():
            ax.text(a, top, f"{f.kind}\n{f.target}", fontsize=6, va="top", rotation=90)
