"""``chronoq bench throughput|failover|precision|scan|move``: benchmarks that report numbers.

Options left unset take the benchmark's own defaults; each benchmark is imported when it runs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Any

import typer

from chronoq.buckets import MAX_PARTITIONS
from chronoq.cli.common import LeaseTtlOpt, TickMsOpt, env, fail, given, reported
from chronoq.cli.dev import PgMembersOpt

bench_app = typer.Typer(help="Benchmarks (numbers, not pass/fail).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``chronoq bench`` to ``app``."""
    app.add_typer(bench_app, name="bench")


def _opt(name: str, help: str | None = None, **kwargs: Any) -> Any:
    return typer.Option(envvar=env(f"BENCH_{name}"), help=help, **kwargs)


DataDirOpt = Annotated[
    Path | None,
    _opt(
        "DATA_DIR",
        "Embedded PostgreSQL data directory [default: a temporary one].",
        file_okay=False,
    ),
]
DsnOpt = Annotated[str | None, _opt("DSN", "Use this PostgreSQL instead of an embedded one.")]
JsonOutOpt = Annotated[Path | None, _opt("JSON_OUT", "Also write results here.", dir_okay=False)]
PartitionsOpt = Annotated[
    int | None,
    typer.Option(
        "--partitions", envvar=env("PARTITIONS"), min=1, max=MAX_PARTITIONS,
        help="Hash partitions of the benchmark's cluster.",
    ),
]
NodesOpt = Annotated[
    int | None, _opt("NODES", "Nodes of the local cluster (failover: at least 2).", min=1, max=16)
]


@bench_app.command("throughput")
def bench_throughput(
    tasks: Annotated[int | None, _opt("TASKS", "Tasks to fire and run.", min=1)] = None,
    workers: Annotated[int | None, _opt("WORKERS", min=1)] = None,
    concurrency: Annotated[int | None, _opt("CONCURRENCY", min=1)] = None,
    data_dir: DataDirOpt = None,
    dsn: DsnOpt = None,
    due_rate: Annotated[int | None, _opt("DUE_RATE", "Tasks coming due per second.", min=1)] = None,
    json_out: JsonOutOpt = None,
    pending_sizes: Annotated[
        str | None,
        _opt(
            "PENDING_SIZES",
            "Comma-separated pending-task counts for the node memory phase (10k, 1M allowed).",
        ),
    ] = None,
    lateness_seconds: Annotated[
        float | None,
        _opt("LATENESS_SECONDS", "How long tasks keep coming due in the lateness phase.", min=0.1),
    ] = None,
    submitters: Annotated[
        str | None, _opt("SUBMITTERS", "Comma-separated counts of concurrent submitters.")
    ] = None,
    layouts: Annotated[
        str | None, _opt("LAYOUTS", "Worker layouts end to end: in-process, processes.")
    ] = None,
    phases: Annotated[
        str | None,
        _opt("PHASES", "Phases to run: raw, submit, fire, e2e, lateness, rss, keys; also backlog."),
    ] = None,
    rss_settle_seconds: Annotated[
        float | None,
        _opt("RSS_SETTLE_SECONDS", "How long a node fires before its memory is read.", min=0.0),
    ] = None,
    backlog_sizes: Annotated[
        str | None,
        _opt(
            "BACKLOG_SIZES",
            "Comma-separated counts of tasks due tomorrow for the backlog phase (1M, 10M).",
        ),
    ] = None,
    backlog_runs: Annotated[
        int | None,
        _opt(
            "BACKLOG_RUNS",
            "Measurements of each backlog size and of the empty table (medians compared).",
            min=1,
            max=20,
        ),
    ] = None,
    protocol: Annotated[
        str | None,
        _opt(
            "PROTOCOL",
            "How workers get tasks: stream (pushed), riding (claims on acks and long-polls, "
            "the protocol before streams), claims (long-polls only).",
        ),
    ] = None,
    prefetch: Annotated[
        int | None,
        _opt(
            "PREFETCH",
            "Tasks each worker may hold beyond those it runs (0: none) [default: the "
            "worker's, 4 x concurrency within a 20 ms horizon].",
            min=0,
        ),
    ] = None,
    store_shards: Annotated[
        str | None,
        _opt(
            "STORE_SHARDS",
            "Comma-separated store shard counts (1,2): a local stack per count, each shard "
            "its own PostgreSQL; submit, fire and end-to-end rates, each server's share and "
            "CPU per task, beside one server's raw ceiling (phases raw,shards unless "
            "--phases says otherwise).",
        ),
    ] = None,
) -> None:
    """Measure submit, firing and claim throughput, and firing cost against pending-set size.

    Example: chronoq bench throughput --tasks 50000 --workers 8 --json-out bench.json;
    chronoq bench throughput --store-shards 1,2
    """
    try:
        module = importlib.import_module("chronoq.bench.throughput")
    except ModuleNotFoundError as exc:
        if exc.name not in ("chronoq.bench", "chronoq.bench.throughput"):
            raise
        fail("the throughput benchmark (chronoq.bench.throughput) is not part of this install")
    with reported():
        try:
            module.main(
                **given(
                    tasks=tasks,
                    workers=workers,
                    concurrency=concurrency,
                    data_dir=data_dir,
                    dsn=dsn,
                    due_rate=due_rate,
                    json_out=json_out,
                    pending_sizes=pending_sizes,
                    lateness_seconds=lateness_seconds,
                    submitters=submitters,
                    layouts=layouts,
                    phases=phases,
                    rss_settle_seconds=rss_settle_seconds,
                    backlog_sizes=backlog_sizes,
                    backlog_runs=backlog_runs,
                    protocol=protocol,
                    prefetch=prefetch,
                    store_shards=store_shards,
                )
            )
        except ValueError as exc:  # a malformed list option
            fail(str(exc), 2)
        except module.BenchError as exc:  # a count out of bounds, a stack that did not start
            fail(f"bench throughput: {exc}")


@bench_app.command("failover")
def bench_failover(
    trials: Annotated[
        int | None, _opt("TRIALS", "Trials of each kind (SIGKILL, SIGTERM).", min=1, max=100)
    ] = None,
    nodes: NodesOpt = None,
    partitions: PartitionsOpt = None,
    lease_ttl: LeaseTtlOpt = None,
    tick_ms: TickMsOpt = None,
    data_dir: Annotated[
        Path | None,
        _opt(
            "DATA_DIR",
            "Where etcd, PostgreSQL and node logs live [default: a temporary dir].",
            file_okay=False,
        ),
    ] = None,
    json_out: JsonOutOpt = None,
    pg_members: PgMembersOpt = 1,
) -> None:
    """Failover (SIGKILL → partitions re-owned → first fire) and graceful handoff (SIGTERM)
    times on a real local cluster, over repeated trials: min / median / max.

    With --pg-members 3 the store fails over instead (3 PostgreSQL members under Patroni):
    primary postmaster kill, primary member kill, switchover; time until submits and firing
    are back, and acknowledged tasks lost (must be 0).

    Example: chronoq bench failover --trials 5 --lease-ttl 2; chronoq bench failover --pg-members 3
    """
    from chronoq.bench.failover import main as failover_main

    if nodes is not None and nodes < 2:
        raise typer.BadParameter("a failover needs 2 nodes or more", param_hint="--nodes")
    with reported():
        failover_main(
            **given(
                trials=trials,
                nodes=nodes,
                partitions=partitions,
                lease_ttl=lease_ttl,
                tick_ms=tick_ms,
                data_dir=data_dir,
                json_out=json_out,
                pg_members=pg_members,
            )
        )


@bench_app.command("precision")
def bench_precision(
    rates: Annotated[
        str | None, _opt("RATES", "Comma-separated tasks coming due per second.")
    ] = None,
    seconds: Annotated[
        float | None, _opt("SECONDS", "How long tasks keep coming due, per rate.", min=0.1)
    ] = None,
    runs: Annotated[int | None, _opt("RUNS", "Runs of each rate (medians).", min=1, max=50)] = None,
    nodes: NodesOpt = None,
    partitions: PartitionsOpt = None,
    concurrency: Annotated[
        int | None, _opt("CONCURRENCY", "Handlers per worker (one worker per node).", min=1)
    ] = None,
    tick_ms: TickMsOpt = None,
    wheel_horizon_ms: Annotated[
        int | None,
        _opt("WHEEL_HORIZON_MS", "The nodes' timing-wheel horizon (0: the tick alone).", min=0),
    ] = None,
    data_dir: Annotated[
        Path | None,
        _opt(
            "DATA_DIR",
            "Where etcd, PostgreSQL and the logs live [default: a temporary dir].",
            file_okay=False,
        ),
    ] = None,
    json_out: JsonOutOpt = None,
    pg_diagnostics: Annotated[
        bool,
        typer.Option(
            "--pg-diagnostics",
            help="Load PostgreSQL's statement statistics and slow-plan logging: print each "
            "run's costliest statements and keep its server log in the data dir.",
        ),
    ] = False,
) -> None:
    """run_at → handler start p50 / p99 / max on a local cluster with a worker on every
    node, per due rate, with the count of early starts and a bare timer's lateness beside.

    Example: chronoq bench precision --rates 1000,5000 --seconds 10 --runs 3
    """
    from chronoq.bench.precision import main as precision_main

    with reported():
        try:
            precision_main(
                **given(
                    rates=rates,
                    seconds=seconds,
                    runs=runs,
                    nodes=nodes,
                    partitions=partitions,
                    concurrency=concurrency,
                    tick_ms=tick_ms,
                    wheel_horizon_ms=wheel_horizon_ms,
                    data_dir=data_dir,
                    json_out=json_out,
                    pg_diagnostics=pg_diagnostics,
                )
            )
        except ValueError as exc:  # a malformed --rates
            fail(str(exc), 2)


@bench_app.command("scan")
def bench_scan(
    sizes: Annotated[
        str | None,
        _opt(
            "SIZES",
            "Comma-separated pending sizes (100k, 1m, 10m); each also gets a "
            "fired history (--history times its size).",
        ),
    ] = None,
    history: Annotated[
        float | None,
        _opt("HISTORY", "The fired history's size as a fraction of the pending set's (0-10; "
             "default 1): a smaller one lets a larger pending set fit the disk.", min=0,
             max=10),
    ] = None,
    only: Annotated[
        str | None,
        _opt("ONLY", "Comma-separated strategies to measure (default all of a,b,b2,c,c2,c3); "
             "leave out b at tens of millions, where its tick walks the whole history."),
    ] = None,
    repeats: Annotated[
        int | None,
        _opt("REPEATS", "Timed runs per strategy (fewer when one is slow).", min=1, max=100),
    ] = None,
    partitions: PartitionsOpt = None,
    nodes: NodesOpt = None,
    order: Annotated[
        str | None,
        _opt(
            "ORDER",
            "Heap order of the load: scattered (submission order, as in "
            "service) or sorted (run_at order, which flatters run_at indexes).",
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    dsn: Annotated[
        str | None, _opt("DSN", "Use this PostgreSQL (a role that may CREATE DATABASE) instead.")
    ] = None,
    out_dir: Annotated[
        Path | None,
        _opt("OUT_DIR", "Where scan.json, scan-plans.txt and scan.png go.", file_okay=False),
    ] = None,
) -> None:
    """Bucketed scans against full-table and run_at-index scans, as pending load grows:
    rows examined, buffers and ms per tick, with EXPLAIN evidence and a log-log plot.

    Example: chronoq bench scan --sizes 100k,1m,10m --out-dir bench-scan
    """
    import asyncpg

    from chronoq.bench.raw import BenchError
    from chronoq.bench.scan import main as scan_main
    from chronoq.embedded.postgres import EmbeddedPostgresError

    with reported():
        try:
            scan_main(
                **given(
                    sizes=sizes,
                    repeats=repeats,
                    partitions=partitions,
                    nodes=nodes,
                    order=order,
                    data_dir=data_dir,
                    dsn=dsn,
                    out_dir=out_dir,
                    history=history,
                    only=only,
                )
            )
        except ValueError as exc:  # a malformed --sizes or --only, or nodes > partitions
            fail(str(exc), 2)
        except (BenchError, EmbeddedPostgresError, asyncpg.PostgresError, OSError) as exc:
            fail(f"bench scan: {exc}")


@bench_app.command("move")
def bench_move(
    pending: Annotated[
        int | None,
        _opt("PENDING", "Pending tasks in the moved shard's partitions (the issue's: 1000000).",
             min=0, max=50_000_000),
    ] = None,
    due_rate: Annotated[
        int | None,
        _opt("DUE_RATE", "Tasks coming due per second during the move (the issue's: 1000).",
             min=1, max=100_000),
    ] = None,
    moved: Annotated[
        int | None, _opt("MOVED", "Partitions moved (of shard-0's half).", min=1)
    ] = None,
    partitions: PartitionsOpt = None,
    nodes: NodesOpt = None,
    data_dir: DataDirOpt = None,
    json_out: JsonOutOpt = None,
) -> None:
    """An online move of partitions from shard-0 to shard-1 of a two-shard local stack while
    tasks come due: its time, the firing gap of the moved partitions, the other partitions'
    lateness, submit errors the client saw (retried) and tasks lost.

    Example: chronoq bench move; chronoq bench move --pending 1000000 --due-rate 1000
    """
    from chronoq.bench.move import BenchError
    from chronoq.bench.move import main as move_main
    from chronoq.embedded.postgres import EmbeddedPostgresError

    with reported():
        try:
            move_main(
                **given(
                    pending=pending,
                    due_rate=due_rate,
                    moved=moved,
                    partitions=partitions,
                    nodes=nodes,
                    data_dir=data_dir,
                    json_out=json_out,
                )
            )
        except (BenchError, EmbeddedPostgresError, OSError) as exc:
            fail(f"bench move: {exc}")
