"""``chronoq store``: the task store's shards as the cluster's shard map places them."""

from __future__ import annotations

from dataclasses import asdict

import typer
from rich.markup import escape
from rich.table import Table

from chronoq.cli.common import DEFAULT_ADDRESS, AddressOpt, JsonOpt, call, fail, out
from chronoq.cli.render import print_json
from chronoq.client import ClusterStatus
from chronoq.models import DEFAULT_NAMESPACE

store_app = typer.Typer(help="The task store's shards.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``chronoq store`` to ``app``."""
    app.add_typer(store_app, name="store")


@store_app.command("shards")
def shards(as_json: JsonOpt = False, address: AddressOpt = DEFAULT_ADDRESS) -> None:
    """Show each store shard: masked DSN, health, partitions held, pending tasks, moves.

    Example: chronoq store shards --json
    """
    cluster = call(address, DEFAULT_NAMESPACE, lambda c: c.status())
    shard_map = cluster.shard_map
    if shard_map is None:
        fail(f"node {cluster.node_id} answered no shard map: upgrade it")
    if as_json:
        print_json({"answered_by": cluster.node_id, **asdict(shard_map)})
        return
    out.print(
        f"shard map version {shard_map.version}, answered by {escape(cluster.node_id)}; "
        f"{cluster.partitions} partitions"
    )
    if shard_map.error:
        out.print(f"[red]the map in etcd was refused: {escape(shard_map.error)}[/]")
    out.print(_shards_table(cluster))
    out.print(
        f"moves in progress: {shard_map.moves_in_progress}"
        if shard_map.moves_in_progress
        else "moves in progress: none"
    )


def _shards_table(cluster: ClusterStatus) -> Table:
    assert cluster.shard_map is not None
    table = Table(title="store shards", title_justify="left")
    for column in ("shard", "dsn", "health", "partitions", "held", "pending (counted buckets)"):
        table.add_column(column, justify="right" if column in ("held", "pending") else "left")
    for s in cluster.shard_map.shards:
        table.add_row(
            escape(s.name),
            escape(s.dsn),
            s.health,
            s.partitions or "-",
            str(s.partition_count),
            str(s.pending),
        )
    return table
