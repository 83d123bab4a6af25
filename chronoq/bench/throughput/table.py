"""The printed table: each chronoq figure beside its raw ceiling and its target."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from chronoq.bench.raw import RawCeilings
from chronoq.bench.throughput.results import (
    BACKLOG_TOLERANCE,
    SUBMIT_BATCH,
    TARGET_DUE_RATE,
    TARGET_E2E_VS_RAW,
    TARGET_P99_MS,
    TARGET_SUBMIT_PER_S,
    BacklogRun,
    EndToEndRun,
    LatenessRun,
    Report,
    RssRun,
    ShardRun,
    e2e_target,
)


def rate(value: float) -> str:
    return f"{value:,.0f}/s"


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def meets(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]below[/]"


def render(report: Report) -> Table:
    """The benchmark's table: each chronoq figure beside its raw ceiling and its target."""
    table = Table(
        title="chronoq throughput on this machine",
        caption="raw ceiling: chronoq's own SQL through asyncpg in tight loops, same run and "
        "server; pipeline = fire, then claim+complete, serially",
    )
    for name in ("measure", "chronoq", "raw ceiling", "chronoq / raw", "target"):
        first = name == "measure"
        table.add_column(name, justify="left" if first else "right", no_wrap=first)
    raw = report.raw
    for run in report.submit:
        ceiling = raw.insert_with(run.submitters) if raw else 0.0
        table.add_row(
            f"submit, batches of {SUBMIT_BATCH}, {run.submitters} submitter"
            + ("s" if run.submitters > 1 else ""),
            rate(run.tasks_per_s),
            f"insert, {run.submitters} conn {rate(ceiling)}" if raw else "-",
            pct(run.tasks_per_s, ceiling),
            f">= {TARGET_SUBMIT_PER_S:,}/s {meets(run.tasks_per_s >= TARGET_SUBMIT_PER_S)}",
        )
    if report.fire is not None:
        table.add_row(
            "fire: firing loop to READY", rate(report.fire.tasks_per_s),
            f"fire_due {rate(raw.fire_per_s)}" if raw else "-",
            pct(report.fire.tasks_per_s, raw.fire_per_s) if raw else "-", "",
        )
    best = report.best_end_to_end()
    for e2e in report.end_to_end:
        mark = " (best)" if e2e is best and len(report.end_to_end) > 1 else ""
        table.add_row(
            f"end to end, {e2e.workers} workers x {e2e.concurrency}, {e2e.layout}, "
            f"{e2e.protocol}{'' if e2e.prefetch is None else f', prefetch {e2e.prefetch}'}{mark}",
            rate(e2e.tasks_per_s),
            (f"pipeline {rate(raw.pipeline_per_s)} (claim+complete "
             f"{rate(raw.claim_complete_best[1])}, {raw.claim_complete_best[0]} conn)")
            if raw else "-",
            pct(e2e.tasks_per_s, raw.pipeline_per_s) if raw else "-",
            e2e_goal(e2e, raw.pipeline_per_s if raw else 0.0),
        )
    lateness_rows(table, report.lateness)
    rss_rows(table, report.rss)
    backlog_rows(table, report.backlog)
    shard_rows(table, report.shards, raw)
    return table


def shard_rows(table: Table, runs: Sequence[ShardRun], raw: RawCeilings | None) -> None:
    """Per shard count: its rates beside N times one server's raw ceiling, then each
    server's share of the tasks and its CPU per task."""
    for run in runs:
        n = run.shards
        label = f"{n} store shard{'s' if n > 1 else ''}, {run.nodes} nodes"
        ceilings = (
            (raw.insert_with(1), "insert"), (raw.fire_per_s, "fire_due"),
            (raw.pipeline_per_s, "pipeline"),
        ) if raw else ((0.0, ""),) * 3  # fmt: skip
        figures = zip(("submit", "fire", "end to end"),
                      (run.submit_per_s, run.fire_per_s, run.e2e_per_s), ceilings, strict=True)
        for what, value, (ceiling, name) in figures:
            table.add_row(
                f"{label}: {what}", rate(value),
                f"{n} x {name} {rate(ceiling)}" if ceiling else "-",
                pct(value, ceiling * n), "",
            )
        for server in run.servers:
            table.add_row(
                f"  {server.name}: {run.share(server):.0%} of tasks (ideal {1 / n:.0%}), "
                "server CPU/task",
                f"submit {run.cpu_us_per_task(server):.1f} µs, "
                f"e2e {run.cpu_us_per_task(server, e2e=True):.1f} µs",
                "", "", "",
            )


def shard_arithmetic(
    runs: Sequence[ShardRun], raw: RawCeilings | None, cpus: int | None
) -> list[str]:
    """What N servers of this size would carry, each on cores of its own, from what each
    spent per task it held here (where the servers share the machine's cores)."""
    lines: list[str] = []
    for run in runs:
        held = [s for s in run.servers if s.tasks]
        if not held:
            continue
        n = len(run.servers)
        for e2e, what, measured in ((False, "submit", run.submit_per_s),
                                    (True, "end to end", run.e2e_per_s)):
            own = [run.cpu_us_per_own_task(s, e2e=e2e) for s in held]
            worst = max(own)
            if worst <= 0:
                continue
            per_core = 1e6 / worst
            shares = " + ".join(f"{run.cpu_us_per_task(s, e2e=e2e):.1f}" for s in run.servers)
            lines.append(
                f"{n} shard(s), {what}: servers' CPU per task {shares} = "
                f"{run.total_cpu_us_per_task(e2e=e2e):.1f} µs; each server spends at most "
                f"{worst:.1f} µs per task it holds, so one core per server carries "
                f"{per_core:,.0f} tasks/s, and {n} such server(s) on cores of their own "
                f"{n * per_core:,.0f} tasks/s (the busiest sets the pace; measured here, "
                f"sharing {cpus or '?'} cores with nodes, clients and workers: {measured:,.0f}/s)"
            )
        if raw is not None:
            lines.append(
                f"{n} shard(s), ceilings: one server's raw insert {raw.insert_with(1):,.0f}/s "
                f"and pipeline {raw.pipeline_per_s:,.0f}/s (same run) x {n} server(s) = "
                f"{n * raw.insert_with(1):,.0f}/s and {n * raw.pipeline_per_s:,.0f}/s"
            )
    return lines


def e2e_goal(e2e: EndToEndRun, pipeline: float) -> str:
    """The end-to-end target cell: tasks/s for the shape and, where set, the share of raw."""
    goal = e2e_target(e2e.workers, e2e.concurrency)
    text = f">= {goal:,}/s {meets(e2e.tasks_per_s >= goal)}"
    if pipeline and (e2e.workers, e2e.concurrency) == (4, 64):
        share = e2e.tasks_per_s / pipeline
        text += f", >= {TARGET_E2E_VS_RAW:.0%} of raw {meets(share >= TARGET_E2E_VS_RAW)}"
    return text


def lateness_rows(table: Table, late: LatenessRun | None) -> None:
    if late is None:
        return
    target = f"p99 <= {TARGET_P99_MS:.0f} ms at {TARGET_DUE_RATE:,}/s"
    if late.due_rate == TARGET_DUE_RATE:
        target = f"p99 <= {TARGET_P99_MS:.0f} ms"
    table.add_row(
        f"lateness p50/p99/max, {late.due_rate:,} due/s",
        f"{late.store_p50_ms:.0f} / {late.store_p99_ms:.0f} / {late.store_max_ms:.0f} ms", "", "",
        f"{target} {meets(late.store_p99_ms <= TARGET_P99_MS)}",
    )
    table.add_row(
        "  same, node's in-memory window",
        f"{late.node_p50_ms:.0f} / {late.node_p99_ms:.0f} / {late.node_max_ms:.0f} ms", "", "", "",
    )
    table.add_row(
        "  run_at -> handler start",
        f"{late.handler_p50_ms:.0f} / {late.handler_p99_ms:.0f} / {late.handler_max_ms:.0f} ms",
        "", "", "",
    )


def within(value: float, base: float, *, higher_is_better: bool) -> str:
    """Whether ``value`` is within ``BACKLOG_TOLERANCE`` of ``base`` (or better)."""
    limit = base * (1 - BACKLOG_TOLERANCE if higher_is_better else 1 + BACKLOG_TOLERANCE)
    ok = value >= limit if higher_is_better else value <= limit
    return f"within {BACKLOG_TOLERANCE:.0%} of empty {meets(ok)}"


def backlog_rows(table: Table, runs: Sequence[BacklogRun]) -> None:
    if not runs or runs[0].pending:
        return
    base = runs[0]
    for run in runs[1:]:
        e2e, late = run.end_to_end, run.lateness
        n = len(run.end_to_end_runs)
        many = f" (median of {n})" if n > 1 else ""
        table.add_row(
            f"end to end, {run.pending:,} due tomorrow{many}", rate(e2e.tasks_per_s),
            f"empty table {rate(base.end_to_end.tasks_per_s)}",
            pct(e2e.tasks_per_s, base.end_to_end.tasks_per_s),
            within(e2e.tasks_per_s, base.end_to_end.tasks_per_s, higher_is_better=True),
        )
        table.add_row(
            f"  lateness p50/p99, {run.pending:,} due tomorrow{many}",
            f"{late.store_p50_ms:.1f} / {late.store_p99_ms:.1f} ms",
            f"empty {base.lateness.store_p50_ms:.1f} / {base.lateness.store_p99_ms:.1f} ms",
            pct(late.store_p99_ms, base.lateness.store_p99_ms),
            within(late.store_p99_ms, base.lateness.store_p99_ms, higher_is_better=False),
        )
        table.add_row(
            "  run_at -> handler start p50/p99",
            f"{late.handler_p50_ms:.0f} / {late.handler_p99_ms:.0f} ms",
            f"empty {base.lateness.handler_p50_ms:.0f} / {base.lateness.handler_p99_ms:.0f} ms",
            pct(late.handler_p99_ms, base.lateness.handler_p99_ms), "",
        )


def rss_rows(table: Table, runs: Sequence[RssRun]) -> None:
    for run in runs:
        growth = ""
        if run is not runs[0]:
            growth = f"{(run.rss_kib - runs[0].rss_kib) / 1024:+.1f} MiB vs {runs[0].pending:,}"
        table.add_row(
            f"node RSS, {run.pending:,} pending", f"{run.rss_kib / 1024:.1f} MiB", "", growth,
            "flat in pending" if run is not runs[0] else "",
        )
