"""``chronoq queues``: a namespace's counts by queue and state, as the partition owners keep
them, with each queue's oldest READY task and how fresh the counts are."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from chronoq.cli.common import (
    DEFAULT_ADDRESS,
    AddressOpt,
    JsonOpt,
    NamespaceOpt,
    call,
    env,
    out,
)
from chronoq.cli.render import plain, print_json, utc
from chronoq.models import DEFAULT_NAMESPACE
from chronoq.queuecounts import QueueSnapshot, StateCounts


def register(app: typer.Typer) -> None:
    """Add ``chronoq queues`` to ``app``."""
    app.command("queues")(queues)


def _age(age: timedelta | None) -> str:
    if age is None:
        return "-"
    seconds = age.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _row(name: str, c: StateCounts, age: str) -> list[str]:
    return [name, str(c.scheduled), str(c.ready), str(c.running), str(c.dead), age]


def counts_table(snap: QueueSnapshot) -> Table:
    """One line per queue, the queues past those answered and the totals."""
    fresh = "never counted" if snap.as_of is None else f"as of {utc(snap.as_of)} UTC"
    table = Table(title=f"queues ({fresh})", title_justify="left")
    for column in ("queue", "scheduled", "ready", "running", "dead", "oldest ready"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for t in snap.queues:
        table.add_row(*_row(escape(t.queue), t.counts, _age(snap.oldest_ready_age(t.queue))))
    if snap.truncated:
        table.add_row(*_row("(other queues)", snap.other, ""))
    table.add_section()
    table.add_row(*_row("total", snap.totals, ""))
    return table


def as_plain(snap: QueueSnapshot) -> dict[str, Any]:
    """The answer as JSON-ready values, each queue with its oldest READY task's age (s)."""
    data: dict[str, Any] = plain(snap)
    for entry, t in zip(data["queues"], snap.queues, strict=True):
        age = snap.oldest_ready_age(t.queue)
        entry["oldest_ready_age"] = None if age is None else age.total_seconds()
    staleness = snap.staleness
    data["staleness"] = None if staleness is None else staleness.total_seconds()
    return data


def queues(
    queue: Annotated[
        list[str] | None,
        typer.Argument(metavar="[QUEUE]...", help="Only these queues (default: every queue)."),
    ] = None,
    label_key: Annotated[
        str | None,
        typer.Option(
            "--label-key",
            envvar=env("QUEUES_LABEL_KEY"),
            help="Also count per value of this label (read up to a bound).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Show the namespace's tasks per queue and state, and each queue's oldest READY task.

    The partition owners recount every few seconds; the title says as of when.

    Example: chronoq queues --json
    """
    snap = call(address, namespace, lambda c: c.queue_counts(queue or (), label_key=label_key))
    if as_json:
        print_json(as_plain(snap))
        return
    out.print(counts_table(snap))
    if snap.uncounted_partitions:
        out.print(
            f"[yellow]{snap.uncounted_partitions} partitions not counted yet "
            "(their tasks are missing above)[/]"
        )
    if label_key:
        labels = Table(title=f"by label {escape(label_key)}", title_justify="left")
        for column in ("queue", "value", "scheduled", "ready", "running", "dead"):
            labels.add_column(column)
        for x in snap.labels:
            c = x.counts
            labels.add_row(
                escape(x.queue),
                escape(x.value or "-"),
                str(c.scheduled),
                str(c.ready),
                str(c.running),
                str(c.dead),
            )
        out.print(labels)
        if snap.labels_capped:
            out.print("[yellow]label counts stopped at their bound: lower bounds[/]")
