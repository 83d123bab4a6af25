"""``chronoq store``: the task store's shards as the cluster's shard map places them."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chronoq.cli.common import DEFAULT_ADDRESS, AddressOpt, JsonOpt, call, fail, out
from chronoq.cli.render import print_json
from chronoq.client import ClusterStatus
from chronoq.client.values import MoveStatus
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
    if shard_map.moves_error:
        out.print(f"[red]move records unreadable: {escape(shard_map.moves_error)}[/]")
    if shard_map.moves:
        out.print(_moves_table("moves (open and recently finished)", shard_map.moves))


@store_app.command("add-shard")
def add_shard(
    dsn: Annotated[
        str,
        typer.Argument(
            envvar="CHRONOQ_SHARD_DSN",
            help="The new shard's PostgreSQL DSN: an empty database (nodes read its password "
            "from their own settings or passfile; etcd gets it masked).",
        ),
    ],
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
) -> None:
    """Register an empty database as the next store shard (it holds nothing until a move).

    Example: chronoq store add-shard postgresql://chronoq@db2:5432/chronoq
    """
    added = call(address, DEFAULT_NAMESPACE, lambda c: c.add_shard(dsn))
    if as_json:
        print_json(asdict(added))
        return
    out.print(
        f"registered {escape(added.shard)} ({escape(added.dsn)}); shard map version "
        f"{added.map_version}. Move partitions to it with: chronoq store move --partitions "
        f"A-B --to {escape(added.shard)}"
    )


@store_app.command("move")
def move(
    partitions: Annotated[
        str,
        typer.Option("--partitions", "-p", help="The partitions to move: 0-63 or 0-15,32,40-47."),
    ],
    to: Annotated[str, typer.Option("--to", help="The shard to move them to: shard-N.")],
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
) -> None:
    """Move partitions to another store shard online (the leading node runs the move; follow
    it with chronoq store shards).

    Example: chronoq store move --partitions 0-63 --to shard-1
    """
    moves = call(address, DEFAULT_NAMESPACE, lambda c: c.move_partitions(partitions, to))
    _print_moves(moves, as_json, "moves asked for")


@store_app.command("rebalance")
def rebalance(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; move nothing.")
    ] = False,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
) -> None:
    """Even out the partitions held per shard, moving the fewest.

    Example: chronoq store rebalance --dry-run
    """
    moves = call(address, DEFAULT_NAMESPACE, lambda c: c.rebalance(dry_run=dry_run))
    if not moves and not as_json:
        out.print("the shards are balanced already: nothing to move")
        return
    _print_moves(moves, as_json, "planned moves (dry run)" if dry_run else "moves asked for")


def _print_moves(moves: list[MoveStatus], as_json: bool, title: str) -> None:
    if as_json:
        print_json([asdict(m) for m in moves])
        return
    out.print(_moves_table(title, moves))


def _moves_table(title: str, moves: list[MoveStatus]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("id", "partitions", "from", "to", "phase", "rows copied", "driver", "error"):
        table.add_column(column, justify="right" if column == "rows copied" else "left")
    for m in moves:
        table.add_row(
            m.id or "-",
            m.partitions,
            escape(m.source),
            escape(m.target),
            m.phase,
            str(m.rows_copied),
            escape(m.driver) or "-",
            escape(m.error) or "",
        )
    return table


def _shards_table(cluster: ClusterStatus) -> Table:
    assert cluster.shard_map is not None
    table = Table(title="store shards", title_justify="left")
    numbers = ("held", "pending (counted buckets)")
    for column in ("shard", "dsn", "health", "partitions", *numbers):
        table.add_column(column, justify="right" if column in numbers else "left")
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
