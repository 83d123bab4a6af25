"""Local-stack commands: ``chronoq dev`` (a local stack), ``chronoq demo`` (the tour) and
``chronoq lab`` (the web lab). Each imports the embedded servers only when it runs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS
from chronoq.cli.common import (
    BucketSecondsOpt,
    DataDirOpt,
    HostOpt,
    LeaseTtlOpt,
    PartitionsOpt,
    PortOpt,
    TickMsOpt,
    duration_opt,
    env,
    err,
    fail,
    given,
    out,
    progress,
    reported,
    run,
)
from chronoq.models import TaskState
from chronoq.redact import mask_dsn
from chronoq.signals import stop_event

if TYPE_CHECKING:
    from chronoq.demo import DemoOptions, DemoRun
    from chronoq.devstack import DevStack, DevStackSettings


#: ``--pg-members``: 1 is the single embedded server; more run Patroni (chronoq.embedded.ha).
PgMembersOpt = Annotated[
    int,
    typer.Option(
        "--pg-members",
        envvar=env("PG_MEMBERS"),
        min=1,
        max=5,
        help="PostgreSQL servers: 1, or 2-5 replicated under Patroni on the stack's etcd "
        "(synchronous; installs Patroni on first use).",
    ),
]


#: ``--store-shards``: 1 is the one store; more are that many servers (chronoq.embedded.shards;
#: the bound and the check against --partitions are there, so the error names both).
StoreShardsOpt = Annotated[
    int,
    typer.Option(
        "--store-shards",
        envvar=env("STORE_SHARDS"),
        min=1,
        help="Store shards: each its own embedded PostgreSQL (with --pg-members N, its own "
        "Patroni cluster), shard-0 the usual one; at most 8, and at most --partitions. More "
        "than 1 runs the nodes as a cluster on etcd (the shard map lives there).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add ``dev``, ``demo`` and ``lab`` to ``app``."""
    app.command()(dev)
    app.command()(demo)
    app.command()(lab)


# ---------------------------------------------------------------------- dev


def dev(
    data_dir: DataDirOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    pg_port: Annotated[
        int,
        typer.Option(
            "--pg-port",
            envvar=env("PG_PORT"),
            min=0,
            max=65535,
            help="PostgreSQL port (0: any free port).",
        ),
    ] = 0,
    partitions: PartitionsOpt = DEFAULT_PARTITIONS,
    bucket_seconds: BucketSecondsOpt = DEFAULT_BUCKET_SECONDS,
    tick_ms: TickMsOpt = None,
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes",
            envvar=env("DEV_NODES"),
            min=1,
            max=32,
            help="Scheduler nodes; more than one runs embedded etcd and node processes.",
        ),
    ] = 1,
    etcd_members: Annotated[
        int,
        typer.Option(
            "--etcd-members",
            envvar=env("DEV_ETCD_MEMBERS"),
            min=1,
            max=7,
            help="Members of the embedded etcd (more than one: nodes run as processes on it).",
        ),
    ] = 1,
    lease_ttl: LeaseTtlOpt = None,
    pg_members: PgMembersOpt = 1,
    store_shards: StoreShardsOpt = 1,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart/--no-restart",
            envvar=env("DEV_RESTART"),
            help="Restart a crashed PostgreSQL, etcd member or node process (with backoff); "
            "--no-restart leaves it down, for fault experiments.",
        ),
    ] = True,
) -> None:
    """Run a local stack: embedded PostgreSQL (kept in --data-dir) and a node, until Ctrl-C.

    With --nodes N (N > 1) it also starts etcd (--etcd-members on loopback) and N node
    processes that share the partitions. What it starts is restarted when it dies, unless
    --no-restart; --data-dir/dev.json lists the PIDs and each node's command line.

    With --pg-members 3, PostgreSQL is replicated: 3 members under Patroni (synchronous
    replication, leader lock in the stack's etcd), installed on first use; the nodes get the
    multi-host DSN and follow the primary through a failover.

    With --store-shards 2 the store is two shards, each its own server (or Patroni cluster),
    started at once and migrated; the nodes get --store-shard for shard-1...

    Example: chronoq dev --port 7070; chronoq dev --nodes 3 --etcd-members 3 --pg-members 3;
    chronoq dev --nodes 2 --store-shards 2
    """
    from chronoq.demo import DEFAULT_DATA_DIR
    from chronoq.devstack import DevStackSettings

    with reported():
        settings = DevStackSettings(
            data_dir=data_dir or DEFAULT_DATA_DIR,
            pg_port=pg_port or None,
            partitions=partitions,
            bucket_seconds=bucket_seconds,
            nodes=nodes,
            etcd_members=etcd_members,
            pg_members=pg_members,
            store_shards=store_shards,
            restart=restart,
            **given(
                host=host,
                port=port,
                tick=None if tick_ms is None else timedelta(milliseconds=tick_ms),
                lease_ttl=lease_ttl,
            ),
        )
    run(_dev(settings))


async def _dev(settings: DevStackSettings) -> None:
    from chronoq.devstack import DevStack

    stop = stop_event()
    what = "PostgreSQL"
    if settings.clustered:
        n = settings.nodes
        pg = f"PostgreSQL x{settings.pg_members} (Patroni)" if settings.replicated else "PostgreSQL"
        if settings.sharded:
            pg = f"{settings.store_shards} store shards of {pg}"
        what = f"etcd x{settings.etcd_members}, {pg} and {n} node process{'es' * (n > 1)}"
    err.print(f"starting {what} in {settings.data_dir} …")
    async with DevStack(settings) as stack:
        out.print(
            f"[bold green]chronoq dev {'cluster' if stack.cluster else 'stack'} is running[/]"
        )
        if stack.cluster is None:
            out.print(f"  gRPC address   {stack.address}")
        else:
            for node in stack.cluster.nodes.values():
                out.print(f"  gRPC address   {node.address}   ({node.node_id}, pid {node.pid})")
            out.print(f"  etcd           {','.join(stack.cluster.etcd_endpoints)}")
            if stack.cluster.etcd is not None and stack.cluster.etcd.auth:
                out.print(f"  etcd password  {stack.cluster.etcd.password_file()} (user chronoq)")
            out.print(f"  node logs      {stack.cluster.workdir}")
        # The password stays out of the terminal (and its scrollback): it is in a file.
        out.print(f"  PostgreSQL DSN {mask_dsn(stack.dsn)}")
        if stack.ha is not None:
            for member in stack.ha.state():
                out.print(
                    f"  PostgreSQL     {member['name']} {member['postgres']} "
                    f"(Patroni {member['api']}, pid {member['patroni_pid']})"
                )
            out.print(f"  member logs    {stack.ha.workdir}")
        else:
            out.print(f"  password file  {stack.postgres.app_password_file}")
            out.print(f"  PostgreSQL     pid {stack.postgres.pid}")
        if settings.sharded:
            _print_shards(stack)
        out.print(
            f"  state          {stack.state_file} (PIDs, node command lines; "
            f"{'restarts what dies' if settings.restart else 'no restarts'})"
        )
        out.print(f"  try: CHRONOQ_ADDRESS={stack.address} chronoq submit hello --in 5s")
        if stack.cluster is not None:
            out.print(f"       chronoq status --address {stack.address}")
        out.print("  Ctrl-C to stop")
        await stop.wait()
        err.print("stopping …")
    err.print("stopped")


def _print_shards(stack: DevStack) -> None:
    """One line per store shard: its DSN (masked), its server and where its password is."""
    dsns = stack.shard_dsns
    out.print(f"  store shards   {len(dsns)} (the nodes get --store-shard for shard-1..)")
    out.print(f"  shard-0        {mask_dsn(dsns['shard-0'])}")
    for server in stack.shards.servers:
        state = server.state()
        out.print(f"  {server.name:<14} {mask_dsn(dsns.get(server.name, '-'))}")
        if server.ha is not None:
            for member in state["members"]:
                out.print(
                    f"  {'':<14} {member['name']} {member['postgres']} "
                    f"(Patroni {member['api']}, pid {member['patroni_pid']})"
                )
        else:
            out.print(f"  {'':<14} pid {state['pid']}, password file {state['password_file']}")


# ---------------------------------------------------------------------- demo


def demo(
    tasks: Annotated[
        int | None, typer.Option(envvar=env("DEMO_TASKS"), min=1, help="Tasks to submit.")
    ] = None,
    over: Annotated[
        timedelta | None,
        duration_opt(envvar=env("DEMO_OVER"), help="Spread run_at uniformly over this long."),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(envvar=env("DEMO_WORKERS"), min=1, help="Workers (in-process).")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(envvar=env("DEMO_CONCURRENCY"), min=1, help="Tasks at once per worker."),
    ] = None,
    fail_rate: Annotated[
        float | None,
        typer.Option(
            envvar=env("DEMO_FAIL_RATE"),
            min=0.0,
            max=1.0,
            help="Share of tasks that fail at least once (a tenth of them fatally).",
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    seed: Annotated[
        int | None, typer.Option(envvar=env("DEMO_SEED"), help="Seed of the failure pattern.")
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            envvar=env("DEMO_NODES"),
            min=1,
            max=16,
            help="Scheduler nodes: more than one is a cluster on an embedded etcd, a process "
            "per node; 1 runs a single node in this process.",
        ),
    ] = None,
    pg_members: PgMembersOpt = 1,
    store_shards: StoreShardsOpt = 1,
) -> None:
    """A one-command tour: a local cluster on the embedded stack, timed tasks, workers,
    retries, a dead-letter queue.

    Uses a fresh database in the embedded PostgreSQL for each run and drops it at the end.
    Example: chronoq demo --tasks 300 --over 5s --workers 2 --nodes 3
    """
    from chronoq.demo import DemoOptions

    options = DemoOptions(
        **given(
            data_dir=data_dir,
            tasks=tasks,
            over=over,
            workers=workers,
            concurrency=concurrency,
            fail_rate=fail_rate,
            seed=seed,
            nodes=nodes,
        ),
        pg_members=pg_members,
        store_shards=store_shards,
    )
    raise typer.Exit(run(_demo(options)))


async def _demo(opts: DemoOptions) -> int:
    from chronoq.demo import run_demo

    stop = stop_event()
    with progress() as bar:
        task = bar.add_task("finished", total=opts.tasks)

        def on_counts(counts: dict[TaskState, int]) -> None:
            done = sum(n for s, n in counts.items() if s.terminal)
            parts = [f"{s.name.lower()} {counts[s]}" for s in TaskState if counts.get(s)]
            bar.update(task, completed=done, description=f"finished  ({', '.join(parts)})")

        result = await run_demo(opts, stop, announce=err.print, on_counts=on_counts)
    out.print(_summary_table(result))
    return _verdict(result, stop.is_set(), opts)


def _ms(value: timedelta | None) -> str:
    return "-" if value is None else f"{value / timedelta(milliseconds=1):.1f} ms"


def _summary_table(result: DemoRun) -> Table:
    summary = result.summary
    fatal, exhausted = result.expected_dead
    table = Table(title="demo summary", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("submitted", str(summary.submitted)),
        ("fired", str(summary.fired)),
        ("succeeded", str(summary.succeeded)),
        ("retried", str(summary.retried)),
        ("dead", str(summary.dead)),
        ("dead expected", f"{fatal + exhausted} ({fatal} fatal, {exhausted} out of attempts)"),
        ("lateness p50", _ms(summary.lateness_p50)),
        ("lateness p99", _ms(summary.lateness_p99)),
        ("lateness max", _ms(summary.lateness_max)),
        ("wall time", f"{result.wall_seconds:.1f} s"),
    ]
    for m in sorted(result.members, key=lambda m: m.node_id):
        rows.append((f"fired by {m.node_id}", f"{m.fired_total} ({m.owned_partitions} partitions)"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _verdict(result: DemoRun, stopped: bool, opts: DemoOptions) -> int:
    summary = result.summary
    if result.finished:
        out.print("[green]every task reached SUCCEEDED or DEAD[/]")
        return 0
    missing = ", ".join(f"{n} {s}" for s, n in summary.unfinished.items()) or "none"
    if stopped:
        err.print(f"[yellow]interrupted; unfinished tasks: {missing}[/]")
        return 130
    err.print(
        f"[bold red]error:[/] [red]not finished after {opts.deadline:.0f} s: "
        f"{summary.submitted - summary.succeeded - summary.dead} of {opts.tasks} tasks "
        f"still open ({missing})[/]"
    )
    return 1


# ---------------------------------------------------------------------- lab


def lab(
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            envvar=env("LAB_PORT"),
            min=0,
            max=65535,
            help="HTTP port of the page (0: any free port) [default: 8080].",
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option("--host", envvar=env("LAB_HOST"), help="Address the page binds."),
    ] = None,
    nodes: Annotated[int | None, typer.Option(envvar=env("LAB_NODES"), min=1, max=8)] = None,
    partitions: PartitionsOpt = DEFAULT_PARTITIONS,
    lease_ttl: LeaseTtlOpt = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar=env("LAB_DATA_DIR"),
            file_okay=False,
            help="Keep etcd, PostgreSQL and node logs here (default: a temporary "
            "directory, removed on exit).",
        ),
    ] = None,
    pg_members: PgMembersOpt = 1,
    store_shards: StoreShardsOpt = 1,
) -> None:
    """An interactive web page over a live local cluster (etcd, PostgreSQL, N nodes, workers)
    on a virtual clock: add load, advance the clock, kill an owner, watch buckets beat scans.

    Example: chronoq lab --port 8080 --nodes 3
    """
    from chronoq.embedded.postgres import EmbeddedPostgresError
    from chronoq.lab.server import LabSettings
    from chronoq.lab.server import run as run_lab

    options: dict[str, Any] = given(port=port, host=host, nodes=nodes, lease_ttl=lease_ttl)
    with reported():
        settings = LabSettings(
            partitions=partitions, data_dir=data_dir, pg_members=pg_members,
            store_shards=store_shards, **options,
        )  # fmt: skip
        try:
            run_lab(settings, announce=lambda line: out.print(escape(line)))
        except (EmbeddedPostgresError, RuntimeError, TimeoutError, OSError) as exc:
            fail(f"lab: {exc}")
