"""``chronoq chaos``: a real cluster under seeded faults, checked against an independent ledger.

Options left unset take ``ChaosOptions``' defaults; the harness is imported when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from chronoq.buckets import MAX_PARTITIONS
from chronoq.cli.common import TickMsOpt, env, err, fail, given, out, reported
from chronoq.cli.dev import PgMembersOpt, StoreShardsOpt
from chronoq.coordinator.ttl import MAX_LEASE_TTL, MIN_LEASE_TTL


def register(app: typer.Typer) -> None:
    """Add ``chronoq chaos`` to ``app``."""
    app.command()(chaos)


def _opt(name: str, help: str | None = None, **kwargs: Any) -> Any:
    return typer.Option(envvar=env(f"CHAOS_{name}"), help=help, **kwargs)


_FAULTS_HELP = (
    "Fault kinds, or 'all': kill-node, freeze-node (under the lease TTL), "
    "freeze-node-past-ttl (was pause-node), kill-worker, pause-worker, "
    "kill-etcd-member, kill-etcd-leader, restart-postgres, cut-node-etcd, "
    "cut-node-postgres, clock-jump, rolling-restart, disk-full (needs root: it mounts a "
    "size-capped filesystem, else it is skipped), slow-links-etcd, slow-links-postgres, "
    "clock-drift; with --pg-members > 1 also kill-pg-primary, kill-pg-member, switchover, "
    "kill-pg-standby (in place of restart-postgres and disk-full); with --store-shards > 1 "
    "also kill-shard-primary (one shard's postmaster, by PID, started again after the hold) "
    "and move-partitions (a move of random partitions between two shards, its driver node "
    "killed mid-move in one variant)."
)


def chaos(
    duration: Annotated[float | None, _opt("DURATION", "Seconds of workload.", min=10)] = None,
    nodes: Annotated[int | None, _opt("NODES", min=2, max=16)] = None,
    workers: Annotated[int | None, _opt("WORKERS", min=1, max=32)] = None,
    etcd_members: Annotated[int | None, _opt("ETCD_MEMBERS", min=1, max=7)] = None,
    faults: Annotated[str, _opt("FAULTS", _FAULTS_HELP, metavar="KIND,...")] = "all",
    seed: Annotated[
        int | None, _opt("SEED", "Replays the same workload and fault schedule.")
    ] = None,
    rate: Annotated[float | None, _opt("RATE", "Tasks submitted per second.", min=1)] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            envvar=env("CHAOS_OUT"),
            file_okay=False,
            help="Where history.json, report.json, timeline.png and logs go [default: chaos-out].",
        ),
    ] = None,
    backend: Annotated[str, _opt("BACKEND", "local (processes) or docker.")] = "local",
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions", envvar=env("PARTITIONS"), min=1, max=MAX_PARTITIONS,
            help="Hash partitions of the chaos cluster.",
        ),
    ] = None,
    lease_ttl: Annotated[
        int | None,
        typer.Option(
            "--lease-ttl", envvar=env("LEASE_TTL"), min=MIN_LEASE_TTL, max=MAX_LEASE_TTL,
            help="etcd lease TTL of each node (short by default, so faults move "
            "partitions within seconds).",
        ),
    ] = None,
    tick_ms: TickMsOpt = None,
    clock_jump_ms: Annotated[int | None, _opt("CLOCK_JUMP_MS", min=1)] = None,
    cluster: Annotated[
        str | None,
        _opt("CLUSTER", "The nodes' --cluster (etcd key prefix); docker: the deployment's."),
    ] = None,
    recheck: Annotated[
        Path | None,
        _opt("RECHECK", "Check a saved history.json again instead of running.", dir_okay=False),
    ] = None,
    compose_project: Annotated[str, _opt("COMPOSE_PROJECT", "docker: compose project.")] = (
        "chronoq"
    ),
    docker_nodes: Annotated[str, _opt("DOCKER_NODES", "docker: node services.")] = (
        "node-1,node-2,node-3"
    ),
    docker_etcd: Annotated[str, _opt("DOCKER_ETCD", "docker: etcd services.")] = (
        "etcd-1,etcd-2,etcd-3"
    ),
    docker_postgres: Annotated[
        str, _opt("DOCKER_POSTGRES", "docker: PostgreSQL service(s), comma-separated.")
    ] = "db-1,db-2,db-3",
    docker_dsn: Annotated[str | None, _opt("DOCKER_DSN", "docker: DSN from here.")] = None,
    pg_members: PgMembersOpt = 1,
    store_shards: StoreShardsOpt = 1,
) -> None:
    """Run a real cluster under a seeded workload and seeded faults, then check an independent
    ledger: none lost, none early, duplicates explained, failover within TTL + a tick, fencing.
    Exits 1 when a check fails.

    Example: chronoq chaos --duration 300 --faults all --seed 7 --out chaos-out
    """
    from chronoq.chaos.docker_backend import DockerUnavailable
    from chronoq.chaos.fault_plan import parse_kinds
    from chronoq.chaos.harness import ChaosOptions, judge, run
    from chronoq.chaos.history import History
    from chronoq.embedded.shards import check_store_shards

    if recheck is not None:
        with reported():
            verdict = judge(History.load(recheck), recheck.parent, out, plot=True)
        raise typer.Exit(0 if verdict.ok else 1)
    if backend not in ("local", "docker"):
        raise typer.BadParameter("local or docker", param_hint="--backend")
    if backend == "docker" and pg_members > 1:
        raise typer.BadParameter(
            "the docker backend uses the deployment's PostgreSQL", param_hint="--pg-members"
        )
    if backend == "docker" and store_shards > 1:
        raise typer.BadParameter(
            "the docker backend uses the deployment's store shards", param_hint="--store-shards"
        )
    with reported():
        check_store_shards(store_shards, partitions or ChaosOptions.partitions)
    try:
        kinds = parse_kinds(faults, replicated=pg_members > 1, sharded=store_shards > 1)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--faults") from None
    docker = {
        "project": compose_project,
        "nodes": tuple(docker_nodes.split(",")),
        "etcd": tuple(docker_etcd.split(",")),
        "postgres": docker_postgres,
        "dsn": docker_dsn,
    }
    options = ChaosOptions(
        faults=tuple(kinds),
        backend=backend,
        docker_services=docker if backend == "docker" else {},
        **given(
            duration=duration,
            nodes=nodes,
            workers=workers,
            etcd_members=etcd_members,
            seed=seed,
            rate=rate,
            out=out_dir,
            partitions=partitions,
            lease_ttl=lease_ttl,
            tick_ms=tick_ms,
            clock_jump_ms=clock_jump_ms,
            cluster=cluster,
        ),
        pg_members=pg_members,
        store_shards=store_shards,
    )
    with reported():
        try:
            code = run(options, out)
        except DockerUnavailable as exc:
            err.print(f"[yellow]skipped:[/yellow] {escape(exc.message)}")
            raise typer.Exit(0) from None
        except ValueError as exc:  # a fault the backend cannot inject
            fail(str(exc), 2)
    raise typer.Exit(code)
