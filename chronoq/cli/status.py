"""``chronoq status``: members, pending tasks per upcoming bucket, partition ownership."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chronoq.cli.common import DEFAULT_ADDRESS, AddressOpt, JsonOpt, call, env, out
from chronoq.cli.render import print_json, when
from chronoq.client import ClusterStatus
from chronoq.models import DEFAULT_NAMESPACE


def register(app: typer.Typer) -> None:
    """Add ``chronoq status`` to ``app``."""
    app.command()(status)


def status(
    buckets: Annotated[
        int,
        typer.Option(
            "--buckets",
            envvar=env("STATUS_BUCKETS"),
            min=1,
            max=1440,
            help="Upcoming buckets to count.",
        ),
    ] = 10,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
) -> None:
    """Show the cluster: members, pending tasks per upcoming bucket, partition ownership.

    Example: chronoq status --buckets 30
    """
    cluster = call(address, DEFAULT_NAMESPACE, lambda c: c.status(buckets))
    if as_json:
        print_json(cluster)
        return
    out.print(
        f"cluster [bold]{escape(cluster.cluster or '-')}[/], answered by "
        f"{escape(cluster.node_id)} at {when(cluster.now)}; {cluster.partitions} partitions, "
        f"{cluster.bucket_seconds} s buckets"
    )
    out.print(_members_table(cluster))
    out.print(_buckets_table(cluster))
    out.print(_ownership_table(cluster))


def _members_table(cluster: ClusterStatus) -> Table:
    table = Table(title="members", title_justify="left")
    for column in ("node", "address", "partitions", "lateness p50", "lateness p99", "fired"):
        table.add_column(column, justify="left" if column in ("node", "address") else "right")
    for m in cluster.members:
        table.add_row(
            escape(m.node_id),
            m.address,
            str(m.owned_partitions),
            f"{m.lateness_p50_ms:.1f} ms",
            f"{m.lateness_p99_ms:.1f} ms",
            str(m.fired_total),
        )
    return table


def _buckets_table(cluster: ClusterStatus) -> Table:
    table = Table(title="pending tasks per bucket", title_justify="left")
    table.add_column("bucket", justify="right")
    table.add_column("starts at")
    table.add_column("pending", justify="right")
    for b in cluster.buckets:
        table.add_row(str(b.bucket), when(b.starts_at), str(b.pending))
    return table


def _ownership_table(cluster: ClusterStatus) -> Table:
    owners: dict[str, list[tuple[int, int]]] = {}
    for p in cluster.ownership:
        owners.setdefault(p.owner or "(none)", []).append((p.fencing_token, p.watermark_bucket))
    table = Table(title="partition ownership", title_justify="left")
    for column in ("owner", "partitions", "fencing tokens", "watermarks"):
        table.add_column(column, justify="left" if column == "owner" else "right")
    for owner, rows in sorted(owners.items()):
        tokens = sorted(t for t, _ in rows)
        marks = sorted(w for _, w in rows)
        table.add_row(
            escape(owner), str(len(rows)), _span(tokens[0], tokens[-1]), _span(marks[0], marks[-1])
        )
    return table


def _span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}..{high}"
