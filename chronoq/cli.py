"""The ``chronoq`` command line: run a dev stack or a node, submit and inspect tasks, run workers.

Every option has a ``CHRONOQ_*`` environment variable, shown in ``--help``. Options that mean
the same thing everywhere share one (``CHRONOQ_ADDRESS``, ``CHRONOQ_DSN``, ``CHRONOQ_PORT``);
options of one command carry its name (``CHRONOQ_SUBMIT_PRIORITY``, ``CHRONOQ_DEMO_TASKS``).

Errors are one red line on stderr and exit code 1 (the request failed) or 2 (bad usage),
never a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import enum
import importlib
import json
import logging
import os
import signal
import sys
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS
from chronoq.client import (
    Client,
    ClusterStatus,
    MemberStatus,
    NewTask,
    Submitted,
    Worker,
    WorkerStats,
)
from chronoq.client.demo import (
    DEMO_QUEUE,
    DemoPayload,
    DemoSummary,
    demo_payloads,
    handlers_for,
    summarize,
)
from chronoq.client.worker import Handler
from chronoq.clock import OffsetClock
from chronoq.config import NodeSettings
from chronoq.coordinator.etcd import ClusterSettings, EtcdSettings
from chronoq.coordinator.vclock import EtcdClock
from chronoq.devstack import DevStack, DevStackSettings
from chronoq.durations import format_duration, parse_duration, parse_instant
from chronoq.errors import ChronoqError, InvalidArgument
from chronoq.models import DEFAULT_NAMESPACE, Limits, MisfirePolicy, Schedule, Task, TaskState
from chronoq.node import Node
from chronoq.recurrence import CatchUp, Cron
from chronoq.redact import MASK, mask_dsn
from chronoq.targets import split_addresses

T = TypeVar("T")

SUBMIT_BATCH = 1000
DEFAULT_ADDRESS = "127.0.0.1:7070"

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

app = typer.Typer(
    name="chronoq",
    help="chronoq: a distributed scheduler for timed tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
dlq_app = typer.Typer(
    help="The dead-letter queue: list and requeue DEAD tasks.", no_args_is_help=True
)
bench_app = typer.Typer(help="Benchmarks (numbers, not pass/fail).", no_args_is_help=True)
schedule_app = typer.Typer(
    help="Recurring schedules: cron expressions or fixed intervals.", no_args_is_help=True
)
app.add_typer(dlq_app, name="dlq")
app.add_typer(schedule_app, name="schedule")
app.add_typer(bench_app, name="bench")


# ---------------------------------------------------------------------- option parsing


def _env(name: str) -> str:
    return f"CHRONOQ_{name}"


def _problem(exc: InvalidArgument) -> str:
    return exc.message.removeprefix(f"{exc.field}: ")


def _duration(value: str | timedelta) -> timedelta:
    if isinstance(value, timedelta):  # a default, already parsed
        return value
    try:
        return parse_duration(value)
    except InvalidArgument as exc:
        raise typer.BadParameter(_problem(exc)) from None


def _instant(value: str | datetime) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return parse_instant(value)
    except InvalidArgument as exc:
        raise typer.BadParameter(_problem(exc)) from None


class StateName(enum.StrEnum):
    scheduled = "scheduled"
    ready = "ready"
    running = "running"
    succeeded = "succeeded"
    dead = "dead"
    cancelled = "cancelled"
    skipped = "skipped"

    @property
    def state(self) -> TaskState:
        return TaskState[self.value.upper()]


class Misfire(enum.StrEnum):
    fire_late = "fire-late"
    skip = "skip"

    @property
    def policy(self) -> MisfirePolicy:
        return MisfirePolicy.SKIP if self is Misfire.skip else MisfirePolicy.FIRE_LATE


class LogLevel(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


AddressOpt = Annotated[
    str,
    typer.Option(
        "--address",
        "-a",
        envvar=_env("ADDRESS"),
        help="gRPC address of any chronoq node, or several comma-separated (round robin, "
        "failing over when one is down).",
    ),
]
NamespaceOpt = Annotated[
    str, typer.Option("--namespace", "-n", envvar=_env("NAMESPACE"), help="Task namespace.")
]
JsonOpt = Annotated[
    bool, typer.Option("--json", envvar=_env("JSON"), help="Print JSON instead of tables.")
]
HostOpt = Annotated[
    str, typer.Option("--host", envvar=_env("HOST"), help="Address the node's gRPC server binds.")
]
PartitionsOpt = Annotated[
    int,
    typer.Option(
        "--partitions",
        envvar=_env("PARTITIONS"),
        min=1,
        max=32767,
        help="Hash partitions; fixed when a database is first used.",
    ),
]
BucketSecondsOpt = Annotated[
    int,
    typer.Option(
        "--bucket-seconds", envvar=_env("BUCKET_SECONDS"), min=1, help="Time bucket width."
    ),
]
TickMsOpt = Annotated[
    int,
    typer.Option(
        "--tick-ms", envvar=_env("TICK_MS"), min=1, max=60_000, help="Firing loop period."
    ),
]
PortOpt = Annotated[
    int,
    typer.Option("--port", envvar=_env("PORT"), min=0, max=65535, help="gRPC port (0: any)."),
]
DataDirOpt = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar=_env("DATA_DIR"),
        file_okay=False,
        help="Where the embedded PostgreSQL keeps its data (reused across runs).",
    ),
]


def _text_opt(flag: str, env: str, help: str, metavar: str = "PEM") -> Any:
    return typer.Option(flag, envvar=_env(env), metavar=metavar, help=help)


# Auth and TLS of `chronoq node` (server side) and of its etcd; see chronoq.auth, chronoq.tls.
TlsCertOpt = Annotated[
    str | None,
    _text_opt("--tls-cert", "TLS_CERT", "Serve the gRPC API over TLS with this certificate chain."),
]
TlsKeyOpt = Annotated[
    str | None, _text_opt("--tls-key", "TLS_KEY", "The private key of --tls-cert.")
]
TlsClientCaOpt = Annotated[
    str | None,
    _text_opt(
        "--tls-client-ca", "TLS_CLIENT_CA", "Mutual TLS: require client certificates of this CA."
    ),
]
AuthTokensOpt = Annotated[
    str | None,
    _text_opt(
        "--auth-tokens",
        "AUTH_TOKENS",
        'Require bearer tokens: a TOML file, [tokens] "tok" = ["namespace", ...] ("*": all).',
        metavar="FILE",
    ),
]
EtcdUserOpt = Annotated[
    str | None, _text_opt("--etcd-user", "ETCD_USER", "etcd user name (etcd auth).", metavar="NAME")
]
EtcdPasswordOpt = Annotated[
    str | None,
    _text_opt(
        "--etcd-password",
        "ETCD_PASSWORD",
        "etcd password (prefer the environment variable).",
        metavar="PASSWORD",
    ),
]
EtcdCaOpt = Annotated[
    str | None, _text_opt("--etcd-ca", "ETCD_CA", "TLS to etcd, trusting this CA.")
]
EtcdCertOpt = Annotated[
    str | None,
    _text_opt("--etcd-cert", "ETCD_CERT", "Client certificate for etcd (--client-cert-auth)."),
]
EtcdKeyOpt = Annotated[
    str | None, _text_opt("--etcd-key", "ETCD_KEY", "The private key of --etcd-cert.")
]

#: Set by the global options (--token, --tls, --tls-ca, --client-cert, --client-key).
_CLIENT_OPTIONS: dict[str, Any] = {}


def _make_client(address: str, namespace: str = DEFAULT_NAMESPACE, **kwargs: Any) -> Client:
    """A client of a node given by --address, with the global token and TLS options."""
    return Client(address, namespace=namespace, **_CLIENT_OPTIONS, **kwargs)


# ---------------------------------------------------------------------- running and errors


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/bold red] [red]{escape(message)}[/red]")
    raise typer.Exit(code)


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    """Turn chronoq errors into one red line and exit code 1."""
    try:
        yield
    except ChronoqError as exc:
        _fail(exc.message)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    with _reported():
        return asyncio.run(coro)


def _on_stop_signals(callback: Callable[[], None]) -> None:
    """Call ``callback`` on SIGINT and SIGTERM (inside a running loop)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, callback)


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    _on_stop_signals(stop.set)
    return stop


@app.callback()
def _configure(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar=_env("CONFIG"),
            dir_okay=False,
            help="A TOML file of settings: a table per command, e.g. [node]; "
            "flags and CHRONOQ_* variables override it.",
        ),
    ] = None,
    log_level: Annotated[
        LogLevel, typer.Option("--log-level", envvar=_env("LOG_LEVEL"), help="Log verbosity.")
    ] = LogLevel.warning,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar=_env("TOKEN"), help="Bearer token for nodes that require one."
        ),
    ] = None,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls", envvar=_env("TLS"), help="Talk TLS to nodes, trusting the system's CAs."
        ),
    ] = False,
    tls_ca: Annotated[
        str | None, _text_opt("--tls-ca", "TLS_CA", "Talk TLS to nodes, trusting this CA.")
    ] = None,
    client_cert: Annotated[
        str | None, _text_opt("--client-cert", "CLIENT_CERT", "Client certificate for mutual TLS.")
    ] = None,
    client_key: Annotated[
        str | None, _text_opt("--client-key", "CLIENT_KEY", "The private key of --client-cert.")
    ] = None,
) -> None:
    """chronoq: a distributed scheduler for timed tasks (PostgreSQL buckets, etcd ownership).

    Client options (--token, --tls, --tls-ca, --client-cert, --client-key) go before the
    command: chronoq --token T --tls-ca ca.pem submit emails.
    """
    _CLIENT_OPTIONS.update(
        token=token, tls=tls, tls_ca=tls_ca, tls_cert=client_cert, tls_key=client_key
    )
    if config is not None:
        # Click's default_map sits below flags and environment variables and above the
        # declared defaults: exactly the order chronoq promises.
        ctx.default_map = _load_config(config)
    logging.basicConfig(
        level=log_level.value.upper(),
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=err, show_path=False, rich_tracebacks=False)],
    )


def _load_config(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        _fail(f"cannot read --config {path}: {exc.strerror}", 2)
    except tomllib.TOMLDecodeError as exc:
        _fail(f"--config {path} is not valid TOML: {exc}", 2)
    tables: dict[str, Any] = {}
    for command, table in data.items():
        if not isinstance(table, dict):
            _fail(f"--config {path}: {command!r} must be a table like [node]", 2)
        tables[command] = {key.replace("-", "_"): value for key, value in table.items()}
    return tables


_SOURCE_NAMES = {
    "COMMANDLINE": "flag",
    "ENVIRONMENT": "env",
    "DEFAULT_MAP": "file",
    "DEFAULT": "default",
    "PROMPT": "prompt",
}
#: Settings whose whole value is a secret, shown as ``MASK``: ``*password`` and these (any
#: other has the passwords of its DSN or URLs masked by ``mask_dsn``; paths stay readable).
_SECRET = frozenset({"token"})


def _print_sources(ctx: typer.Context) -> None:
    """The effective value of every option of a command, and where it came from."""
    table = Table(title=f"chronoq {ctx.info_name}: effective settings", title_justify="left")
    for column in ("setting", "value", "from"):
        table.add_column(column)
    for param in ctx.command.params:
        name = param.name or ""
        if name in ("show_config", "help") or param.param_type_name != "option":
            continue
        value = ctx.params.get(name)
        source = ctx.get_parameter_source(name)
        origin = _SOURCE_NAMES.get(source.name if source else "DEFAULT", "default")
        if origin == "env" and param.envvar:
            origin = f"env {param.envvar}"
        shown = "-" if value is None else _redact(name, str(value))
        table.add_row(param.opts[0], escape(shown), origin)
    out.print(table)


def _redact(name: str, value: str) -> str:
    """A setting's value fit to print: secrets masked wherever they sit."""
    if name in _SECRET or name.endswith("password"):
        return MASK
    return mask_dsn(value)


@app.command("config", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def config_command(ctx: typer.Context) -> None:
    """Show the effective settings of a node and where each came from (flag, CHRONOQ_*
    variable, the --config file, or the default). Extra arguments are node flags.

    Example: chronoq --config chronoq.toml config --port 7071
    """
    root = ctx.find_root()
    node_cmd = root.command.commands["node"]  # type: ignore[attr-defined]
    sub = node_cmd.make_context("node", [*ctx.args, "--show-config"], parent=root)
    with sub:
        node_cmd.invoke(sub)


# ---------------------------------------------------------------------- rendering


def _plain(value: Any) -> Any:
    """A JSON-ready copy: enums by name, times in ISO 8601, durations in seconds."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return _payload_text(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _payload_text(payload: bytes) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(payload).decode()


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(_plain(value), indent=2))


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds") if value is not None else "-"


def _utc(value: datetime) -> str:
    """Compact UTC time for table cells (the column header says UTC)."""
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S.%f}"[:-3]


_STATE_STYLE = {
    TaskState.SCHEDULED: "cyan",
    TaskState.READY: "yellow",
    TaskState.RUNNING: "blue",
    TaskState.SUCCEEDED: "green",
    TaskState.DEAD: "red",
    TaskState.CANCELLED: "dim",
    TaskState.SKIPPED: "dim",
}


def _state(state: TaskState) -> str:
    return f"[{_STATE_STYLE[state]}]{state.name}[/]"


def _task_table(task: Task) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, str]] = [
        ("id", task.id),
        ("namespace", task.namespace),
        ("queue", task.queue),
        ("state", _state(task.state)),
        ("run_at", _when(task.run_at)),
        ("attempt", f"{task.attempt} of {task.max_attempts}"),
        ("priority", str(task.priority)),
        ("partition / bucket", f"{task.partition} / {task.bucket}"),
        ("idempotency_key", escape(task.idempotency_key or "-")),
        ("payload", escape(_short(_payload_text(task.payload), 200))),
        ("lease_timeout", format_duration(task.lease_timeout)),
        ("misfire", f"{task.misfire_policy.name} (grace {format_duration(task.misfire_grace)})"),
        ("created_at", _when(task.created_at)),
        ("fired_at", _when(task.fired_at)),
        ("lease_until", _when(task.lease_until)),
        ("worker_id", escape(task.worker_id or "-")),
        ("finished_at", _when(task.finished_at)),
        ("last_error", escape(task.last_error or "-")),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tasks_table(tasks: Sequence[Task], *, title: str, errors: bool = False) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("queue", "state", "run_at (UTC)", "attempt"):
        table.add_column(column)
    table.add_column("last error" if errors else "payload", overflow="fold")
    for t in tasks:
        detail = t.last_error or "" if errors else _payload_text(t.payload)
        table.add_row(
            t.id,
            escape(t.queue),
            _state(t.state),
            _utc(t.run_at),
            f"{t.attempt}/{t.max_attempts}",
            escape(_short(detail, 60)),
        )
    return table


# ---------------------------------------------------------------------- dev and node


@app.command()
def dev(
    data_dir: DataDirOpt = Path(".chronoq"),
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 7070,
    pg_port: Annotated[
        int,
        typer.Option(
            "--pg-port",
            envvar=_env("PG_PORT"),
            min=0,
            max=65535,
            help="PostgreSQL port (0: any free port).",
        ),
    ] = 0,
    partitions: PartitionsOpt = DEFAULT_PARTITIONS,
    bucket_seconds: BucketSecondsOpt = DEFAULT_BUCKET_SECONDS,
    tick_ms: TickMsOpt = 100,
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes",
            envvar=_env("DEV_NODES"),
            min=1,
            max=32,
            help="Scheduler nodes; more than one runs embedded etcd and node processes.",
        ),
    ] = 1,
    etcd_members: Annotated[
        int,
        typer.Option(
            "--etcd-members",
            envvar=_env("DEV_ETCD_MEMBERS"),
            min=1,
            max=7,
            help="Members of the embedded etcd (more than one: nodes run as processes on it).",
        ),
    ] = 1,
    lease_ttl: Annotated[
        int,
        typer.Option(
            "--lease-ttl",
            envvar=_env("LEASE_TTL"),
            min=2,
            max=300,
            help="etcd lease TTL of each node, seconds (with --nodes > 1).",
        ),
    ] = 5,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart/--no-restart",
            envvar=_env("DEV_RESTART"),
            help="Restart a crashed PostgreSQL, etcd member or node process (with backoff); "
            "--no-restart leaves it down, for fault experiments.",
        ),
    ] = True,
) -> None:
    """Run a local stack: embedded PostgreSQL (kept in --data-dir) and a node, until Ctrl-C.

    With --nodes N (N > 1) it also starts etcd (--etcd-members on loopback) and N node
    processes that share the partitions. What it starts is restarted when it dies, unless
    --no-restart; --data-dir/dev.json lists the PIDs and each node's command line.

    Example: chronoq dev --port 7070; chronoq dev --nodes 3 --etcd-members 3
    """
    with _reported():
        settings = DevStackSettings(
            data_dir=data_dir,
            host=host,
            port=port,
            pg_port=pg_port or None,
            partitions=partitions,
            bucket_seconds=bucket_seconds,
            tick=timedelta(milliseconds=tick_ms),
            nodes=nodes,
            etcd_members=etcd_members,
            lease_ttl=lease_ttl,
            restart=restart,
        )
    _run(_dev(settings))


async def _dev(settings: DevStackSettings) -> None:
    stop = _stop_event()
    what = "PostgreSQL"
    if settings.clustered:
        n = settings.nodes
        what = f"etcd x{settings.etcd_members}, PostgreSQL and {n} node process{'es' * (n > 1)}"
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
            out.print(f"  node logs      {stack.cluster.workdir}")
        # The password stays out of the terminal (and its scrollback): it is in a file.
        out.print(f"  PostgreSQL DSN {mask_dsn(stack.dsn)}")
        out.print(f"  password file  {stack.postgres.password_file}")
        out.print(f"  PostgreSQL     pid {stack.postgres.pid}")
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


node_app = typer.Typer(
    help="Run a scheduler node (or `chronoq node drain` one).",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(node_app, name="node")


@node_app.command("drain")
def node_drain(
    address: AddressOpt = DEFAULT_ADDRESS,
) -> None:
    """Hand a node's partitions to the others and take no more; it keeps serving the API,
    so workers finish what they hold. Stop it afterwards.

    Example: chronoq node drain --address 127.0.0.1:7071
    """
    if len(split_addresses(address)) != 1:
        raise typer.BadParameter(
            "drain one node at a time: give its address only", param_hint="--address"
        )
    released = _run(_with_client(address, DEFAULT_NAMESPACE, lambda c: c.drain()))
    out.print(f"drained {address}: released {len(released)} partitions")


@node_app.callback()
def node(
    ctx: typer.Context,
    dsn: Annotated[
        str | None,
        typer.Option("--dsn", envvar=_env("DSN"), help="PostgreSQL DSN of the task store."),
    ] = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 7070,
    node_id: Annotated[
        str | None,
        typer.Option(
            "--node-id", envvar=_env("NODE_ID"), help="Stable node name [default: random]."
        ),
    ] = None,
    partitions: PartitionsOpt = DEFAULT_PARTITIONS,
    bucket_seconds: BucketSecondsOpt = DEFAULT_BUCKET_SECONDS,
    tick_ms: TickMsOpt = 100,
    max_payload_bytes: Annotated[
        int,
        typer.Option(
            "--max-payload-bytes",
            envvar=_env("MAX_PAYLOAD_BYTES"),
            min=0,
            help="Largest payload a submit may carry.",
        ),
    ] = Limits.max_payload_bytes,
    horizon_days: Annotated[
        int,
        typer.Option(
            "--horizon-days",
            envvar=_env("HORIZON_DAYS"),
            min=1,
            help="How far ahead a task may be scheduled.",
        ),
    ] = 366,
    etcd: Annotated[
        str | None,
        typer.Option(
            "--etcd",
            envvar=_env("ETCD"),
            metavar="HOST:PORT,...",
            help="etcd endpoints: join a cluster [default: own every partition alone].",
        ),
    ] = None,
    cluster: Annotated[
        str, typer.Option("--cluster", envvar=_env("CLUSTER"), help="Cluster name in etcd.")
    ] = "default",
    lease_ttl: Annotated[
        int,
        typer.Option(
            "--lease-ttl",
            envvar=_env("LEASE_TTL"),
            min=1,
            help="Seconds of silence before a node's partitions move to others.",
        ),
    ] = 5,
    virtual_clock: Annotated[
        bool,
        typer.Option(
            "--virtual-clock",
            envvar=_env("VIRTUAL_CLOCK"),
            help="Fire by the cluster's shared virtual clock in etcd (tests, the lab).",
        ),
    ] = False,
    clock_offset_ms: Annotated[
        int,
        typer.Option(
            "--clock-offset-ms",
            envvar=_env("CLOCK_OFFSET_MS"),
            hidden=True,
            help="Run the node's clock this far ahead (or behind): the chaos "
            "harness's clock-jump fault.",
        ),
    ] = 0,
    max_clock_offset_ms: Annotated[
        int,
        typer.Option(
            "--max-clock-offset-ms",
            envvar=_env("MAX_CLOCK_OFFSET_MS"),
            min=0,
            help="With --etcd: off by more than this from PostgreSQL's clock, the node hands "
            "its partitions off and reports NOT_SERVING until its clock is right (0: never "
            "checked).",
        ),
    ] = 500,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_client_ca: TlsClientCaOpt = None,
    auth_tokens: AuthTokensOpt = None,
    etcd_user: EtcdUserOpt = None,
    etcd_password: EtcdPasswordOpt = None,
    etcd_ca: EtcdCaOpt = None,
    etcd_cert: EtcdCertOpt = None,
    etcd_key: EtcdKeyOpt = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            envvar=_env("METRICS_HOST"),
            help="Address of the Prometheus /metrics endpoint.",
        ),
    ] = "127.0.0.1",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar=_env("METRICS_PORT"),
            min=0,
            help="Serve Prometheus metrics on this port [default: off].",
        ),
    ] = None,
    retention_days: Annotated[
        float,
        typer.Option(
            "--retention-days",
            envvar=_env("RETENTION_DAYS"),
            min=0,
            help="Keep SUCCEEDED/CANCELLED/SKIPPED tasks this long (0: forever).",
        ),
    ] = 7.0,
    dead_retention_days: Annotated[
        float,
        typer.Option(
            "--dead-retention-days",
            envvar=_env("DEAD_RETENTION_DAYS"),
            min=0,
            help="Keep DEAD tasks (the DLQ) this long (0: forever).",
        ),
    ] = 30.0,
    submit_quota: Annotated[
        float | None,
        typer.Option(
            "--submit-quota",
            envvar=_env("SUBMIT_QUOTA"),
            min=0,
            help="Submits per second per namespace on this node "
            "(RESOURCE_EXHAUSTED above) [default: unlimited].",
        ),
    ] = None,
    submit_quota_burst: Annotated[
        float | None,
        typer.Option(
            "--submit-quota-burst",
            envvar=_env("SUBMIT_QUOTA_BURST"),
            min=1,
            help="Burst of the submit quota [default: 1 s worth].",
        ),
    ] = None,
    show_config: Annotated[
        bool,
        typer.Option(
            "--show-config",
            help="Print the effective settings, where each "
            "came from (flag, env, file, default), and exit.",
        ),
    ] = False,
) -> None:
    """Run a scheduler node on an external PostgreSQL (and etcd), until Ctrl-C or SIGTERM.

    Settings come from flags, then CHRONOQ_* variables, then the [node] table of the file
    given by --config (CHRONOQ_CONFIG), then defaults.

    Example: chronoq node --dsn postgresql://chronoq@db:5432/chronoq --etcd etcd:2379
    """
    if ctx.invoked_subcommand is not None:
        return
    if show_config:
        _print_sources(ctx)
        return
    if dsn is None:
        raise typer.BadParameter(
            "a PostgreSQL DSN is needed (or CHRONOQ_DSN, or dsn in the [node] table of --config)",
            param_hint="--dsn",
        )
    if virtual_clock and not etcd:
        raise typer.BadParameter(
            "the virtual clock lives in etcd: give --etcd too", param_hint="--virtual-clock"
        )
    fields: dict[str, Any] = {}
    if node_id:
        fields["node_id"] = node_id
    with _reported():
        etcd_access = {
            "username": etcd_user,
            "password": etcd_password,
            "ca_cert": etcd_ca,
            "cert_cert": etcd_cert,
            "cert_key": etcd_key,
        }
        if etcd:
            fields["cluster"] = _cluster_settings(etcd, cluster, lease_ttl, **etcd_access)
        elif any(etcd_access.values()):
            raise typer.BadParameter(
                "etcd credentials and TLS need --etcd too", param_hint="--etcd-*"
            )
        settings = NodeSettings(
            dsn=dsn,
            host=host,
            port=port,
            partitions=partitions,
            bucket_seconds=bucket_seconds,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
            auth_tokens=auth_tokens,
            tick=timedelta(milliseconds=tick_ms),
            metrics_host=metrics_host,
            metrics_port=metrics_port,
            retention=timedelta(days=retention_days) if retention_days else None,
            dead_retention=timedelta(days=dead_retention_days) if dead_retention_days else None,
            submit_quota=submit_quota or None,
            submit_quota_burst=submit_quota_burst,
            max_clock_offset=timedelta(milliseconds=max_clock_offset_ms)
            if max_clock_offset_ms
            else None,
            limits=Limits(
                max_payload_bytes=max_payload_bytes, horizon=timedelta(days=horizon_days)
            ),
            **fields,
        )
    _run(_node(settings, virtual_clock=virtual_clock, clock_offset_ms=clock_offset_ms))


def _cluster_settings(
    endpoints: str,
    cluster: str,
    lease_ttl: int,
    *,
    username: str | None = None,
    password: str | None = None,
    ca_cert: str | None = None,
    cert_cert: str | None = None,
    cert_key: str | None = None,
) -> ClusterSettings:
    hosts = [e.strip() for e in endpoints.split(",") if e.strip()]
    etcd = EtcdSettings(
        endpoints=hosts,
        cluster=cluster,
        username=username,
        password=password,
        ca_cert=ca_cert,
        cert_cert=cert_cert,
        cert_key=cert_key,
    )
    return ClusterSettings(etcd=etcd, lease_ttl=lease_ttl)


async def _node(settings: NodeSettings, *, virtual_clock: bool, clock_offset_ms: int = 0) -> None:
    stop = _stop_event()
    async with contextlib.AsyncExitStack() as stack:
        clock = await _virtual_clock(settings, stack) if virtual_clock else None
        # A deliberately skewed system clock (chaos clock-jump fault); never set in production.
        skewed = OffsetClock(timedelta(milliseconds=clock_offset_ms)) if clock_offset_ms else None
        server = Node(settings, clock=clock or skewed)
        if clock is not None:
            clock.on_jump = lambda: server.firer.poke() if server.firer is not None else None
        await _start_node(server)
        stack.push_async_callback(server.stop)
        out.print(f"node {settings.node_id} serving on {server.address} (Ctrl-C to stop)")
        await stop.wait()
        err.print("stopping …")


async def _virtual_clock(settings: NodeSettings, stack: contextlib.AsyncExitStack) -> EtcdClock:
    assert settings.cluster is not None
    clock = EtcdClock(settings.cluster.etcd)
    await clock.start()
    stack.push_async_callback(clock.stop)
    return clock


async def _start_node(server: Node) -> None:
    try:
        await server.start()
    except (RuntimeError, OSError) as exc:  # grpc bind failures are RuntimeErrors
        await server.stop(grace=0)
        _fail(f"node could not start on {server.settings.host}:{server.settings.port}: {exc}")
    except BaseException:
        await server.stop(grace=0)
        raise


# ---------------------------------------------------------------------- submit


def _read_payload(payload: str | None, payload_file: Path | None) -> bytes:
    if payload is not None and payload_file is not None:
        raise typer.BadParameter(
            "use --payload or --payload-file, not both", param_hint="--payload"
        )
    if payload_file is None:
        return (payload or "").encode()
    if str(payload_file) == "-":
        return sys.stdin.buffer.read()
    try:
        return payload_file.read_bytes()
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot read {payload_file}: {exc.strerror}", param_hint="--payload-file"
        ) from None


@app.command()
def submit(
    queue: Annotated[str, typer.Argument(help="Queue the task goes to.")],
    at: Annotated[
        datetime | None,
        typer.Option(
            "--at",
            parser=_instant,
            metavar="ISO8601",
            envvar=_env("SUBMIT_AT"),
            help="When to run, with a zone: 2030-01-01T12:00:00Z.",
        ),
    ] = None,
    in_: Annotated[
        timedelta | None,
        typer.Option(
            "--in",
            parser=_duration,
            metavar="DURATION",
            envvar=_env("SUBMIT_IN"),
            help="Run after this delay: 250ms, 30s, 5m, 1h, 2d. Default: now.",
        ),
    ] = None,
    payload: Annotated[
        str | None, typer.Option(envvar=_env("SUBMIT_PAYLOAD"), help="Payload text.")
    ] = None,
    payload_file: Annotated[
        Path | None,
        typer.Option(
            envvar=_env("SUBMIT_PAYLOAD_FILE"),
            dir_okay=False,
            help="Read the payload from a file ('-': stdin).",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            envvar=_env("SUBMIT_KEY"),
            help="Idempotency key: a second submit returns the first task.",
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(envvar=_env("SUBMIT_MAX_ATTEMPTS"), min=1, help="Attempts before DEAD."),
    ] = None,
    priority: Annotated[
        int, typer.Option(envvar=_env("SUBMIT_PRIORITY"), help="Higher is claimed first.")
    ] = 0,
    lease_timeout: Annotated[
        timedelta | None,
        typer.Option(
            parser=_duration,
            metavar="DURATION",
            envvar=_env("SUBMIT_LEASE_TIMEOUT"),
            help="A worker's lease per attempt, e.g. 30s.",
        ),
    ] = None,
    misfire: Annotated[
        Misfire,
        typer.Option(envvar=_env("SUBMIT_MISFIRE"), help="What to do when fired late."),
    ] = Misfire.fire_late,
    misfire_grace: Annotated[
        timedelta | None,
        typer.Option(
            parser=_duration,
            metavar="DURATION",
            envvar=_env("SUBMIT_MISFIRE_GRACE"),
            help="How late 'skip' still fires, e.g. 60s.",
        ),
    ] = None,
    count: Annotated[
        int,
        typer.Option(
            envvar=_env("SUBMIT_COUNT"),
            min=1,
            help=f"Submit this many copies (in batches of {SUBMIT_BATCH}).",
        ),
    ] = 1,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Submit a task (or --count copies) and print its id.

    Example: chronoq submit emails --in 5m --payload '{"to": "a@example.com"}'
    """
    if at is not None and in_ is not None:
        raise typer.BadParameter("use --at or --in, not both", param_hint="--at / --in")
    template = NewTask(
        queue=queue,
        run_at=at,
        delay=in_,
        payload=_read_payload(payload, payload_file),
        max_attempts=max_attempts,
        priority=priority,
        lease_timeout=lease_timeout,
        misfire_policy=misfire.policy,
        misfire_grace=misfire_grace,
    )
    results = _run(_submit(address, namespace, template, key, count))
    for result in results:
        typer.echo(result.task.id)
        if not result.created:
            err.print(
                f"[yellow]{result.task.id}: already submitted with key "
                f"{escape(result.task.idempotency_key or '')!s}; not created again[/]"
            )


async def _submit(
    address: str, namespace: str, template: NewTask, key: str | None, count: int
) -> list[Submitted]:
    def one(i: int) -> NewTask:
        k = key if count == 1 or key is None else f"{key}-{i}"
        return dataclasses.replace(template, idempotency_key=k)

    results: list[Submitted] = []
    async with _make_client(address, namespace) as client:
        with _progress(count > SUBMIT_BATCH) as progress:
            bar = progress.add_task("submitting", total=count)
            for start in range(0, count, SUBMIT_BATCH):
                batch = [one(i) for i in range(start, min(count, start + SUBMIT_BATCH))]
                results += await client.submit_many(batch)
                progress.advance(bar, len(batch))
    return results


def _progress(visible: bool = True) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not visible,
    )


# ---------------------------------------------------------------------- get, cancel, list, dlq


@app.command()
def get(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.")],
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Show one task.

    Example: chronoq get 0b6f6a1e-8d4c-4c3a-9a57-3c1f0e7b1d2a --json
    """
    task = _run(_with_client(address, namespace, lambda c: c.get(task_id)))
    if as_json:
        _print_json(task)
    else:
        out.print(_task_table(task))


@app.command()
def cancel(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.")],
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Cancel a task that has not finished (a running worker learns it by heartbeat).

    Example: chronoq cancel 0b6f6a1e-8d4c-4c3a-9a57-3c1f0e7b1d2a
    """
    task = _run(_with_client(address, namespace, lambda c: c.cancel(task_id)))
    if as_json:
        _print_json(task)
    else:
        out.print(f"{task.id} {_state(task.state)}")


async def _with_client(
    address: str, namespace: str, call: Callable[[Client], Coroutine[Any, Any, T]]
) -> T:
    async with _make_client(address, namespace) as client:
        return await call(client)


async def _collect(
    address: str,
    namespace: str,
    *,
    queue: str | None,
    state: TaskState | None,
    dead: bool,
    limit: int,
) -> list[Task]:
    tasks: list[Task] = []
    token = ""
    async with _make_client(address, namespace) as client:
        while len(tasks) < limit:
            page = await client.list(
                queue=queue,
                state=state,
                dead=dead,
                page_token=token,
                page_size=min(1000, limit - len(tasks)),
            )
            tasks += page.tasks
            token = page.next_token
            if not token:
                break
    return tasks


@app.command("list")
def list_tasks(
    queue: Annotated[
        str | None,
        typer.Option("--queue", "-q", envvar=_env("LIST_QUEUE"), help="Only this queue."),
    ] = None,
    state: Annotated[
        StateName | None,
        typer.Option("--state", envvar=_env("LIST_STATE"), help="Only this state."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", envvar=_env("LIST_LIMIT"), min=1, help="At most this many.")
    ] = 50,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """List tasks, ordered by id.

    Example: chronoq list --queue emails --state scheduled --limit 20
    """
    tasks = _run(
        _collect(
            address,
            namespace,
            queue=queue,
            state=state.state if state else None,
            dead=False,
            limit=limit,
        )
    )
    if as_json:
        _print_json(tasks)
    else:
        out.print(_tasks_table(tasks, title=f"{len(tasks)} task(s)"))


@dlq_app.command("list")
def dlq_list(
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", envvar=_env("DLQ_QUEUE"), help="Only this queue.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", envvar=_env("DLQ_LIMIT"), min=1, help="At most this many.")
    ] = 50,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """List DEAD tasks with their last error.

    Example: chronoq dlq list --queue emails
    """
    tasks = _run(_collect(address, namespace, queue=queue, state=None, dead=True, limit=limit))
    if as_json:
        _print_json(tasks)
    else:
        out.print(_tasks_table(tasks, title=f"{len(tasks)} dead task(s)", errors=True))


@dlq_app.command("requeue")
def dlq_requeue(
    task_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Dead task ids.")],
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Requeue DEAD tasks to run now with a fresh attempt budget (all or none).

    Example: chronoq dlq requeue 0b6f6a1e-8d4c-4c3a-9a57-3c1f0e7b1d2a
    """
    tasks = _run(_with_client(address, namespace, lambda c: c.requeue(task_ids)))
    for task in tasks:
        out.print(f"{task.id} {_state(task.state)}")


# ---------------------------------------------------------------------- schedules


def _schedules_table(schedules: Sequence[Schedule]) -> Table:
    table = Table(title="schedules", title_justify="left")
    for column in (
        "name",
        "queue",
        "rule",
        "catch-up",
        "state",
        "next (UTC)",
        "created",
        "skipped",
    ):
        table.add_column(column)
    for s in schedules:
        rule = s.spec.rule
        text = (
            f"cron {rule.expression} ({rule.timezone})"
            if isinstance(rule, Cron)
            else f"every {format_duration(rule.interval)}"
        )
        table.add_row(
            escape(s.spec.name),
            escape(s.spec.queue),
            escape(text),
            s.spec.catch_up.name.lower(),
            "paused" if s.paused else "active",
            _utc(s.next_fire_at),
            str(s.created_total),
            str(s.skipped_total),
        )
    return table


@schedule_app.command("create")
def schedule_create(
    name: Annotated[str, typer.Argument(help="Schedule name, unique in its namespace.")],
    queue: Annotated[
        str,
        typer.Option(
            "--queue", "-q", envvar=_env("SCHEDULE_QUEUE"), help="Queue of the tasks it creates."
        ),
    ],
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            envvar=_env("SCHEDULE_CRON"),
            help="5-field cron expression, e.g. '*/5 * * * *'.",
        ),
    ] = None,
    every: Annotated[
        str | None,
        typer.Option(
            "--every", envvar=_env("SCHEDULE_EVERY"), help="Fixed interval, e.g. 30s, 5m, 1h."
        ),
    ] = None,
    tz: Annotated[
        str,
        typer.Option(
            "--tz", envvar=_env("SCHEDULE_TZ"), help="IANA time zone of the cron expression."
        ),
    ] = "UTC",
    catch_up: Annotated[
        str,
        typer.Option(
            "--catch-up",
            envvar=_env("SCHEDULE_CATCH_UP"),
            help="After downtime: all, latest or none.",
        ),
    ] = "latest",
    payload: Annotated[str, typer.Option("--payload", envvar=_env("SCHEDULE_PAYLOAD"))] = "",
    start_at: Annotated[
        str | None,
        typer.Option(
            "--start-at",
            envvar=_env("SCHEDULE_START_AT"),
            help="First occurrence not before (ISO 8601).",
        ),
    ] = None,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Create a recurring schedule; each occurrence becomes a task on --queue.

    Example: chronoq schedule create nightly --queue reports --cron '30 2 * * *' --tz Europe/Paris
    """
    if (cron is None) == (every is None):
        _fail("give exactly one of --cron and --every", 2)
    policies = {"all": CatchUp.ALL, "latest": CatchUp.LATEST, "none": CatchUp.NONE}
    if catch_up not in policies:
        _fail(f"--catch-up must be all, latest or none, not {catch_up!r}", 2)
    interval = _duration(every) if every is not None else None
    start = _instant(start_at) if start_at is not None else None
    made = _run(
        _with_client(
            address,
            namespace,
            lambda c: c.create_schedule(
                name,
                queue,
                cron=cron,
                every=interval,
                timezone=tz,
                start_at=start,
                catch_up=policies[catch_up],
                payload=payload.encode(),
            ),
        )
    )
    out.print(_schedules_table([made]))


@schedule_app.command("list")
def schedule_list(
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """List the schedules of a namespace."""
    out.print(
        _schedules_table(_run(_with_client(address, namespace, lambda c: c.list_schedules())))
    )


@schedule_app.command("pause")
def schedule_pause(
    name: Annotated[str, typer.Argument()],
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Pause a schedule: no occurrence is created until it is resumed."""
    out.print(
        _schedules_table([_run(_with_client(address, namespace, lambda c: c.pause_schedule(name)))])
    )


@schedule_app.command("resume")
def schedule_resume(
    name: Annotated[str, typer.Argument()],
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Resume a paused schedule from its next occurrence (paused time is not caught up)."""
    out.print(
        _schedules_table(
            [_run(_with_client(address, namespace, lambda c: c.resume_schedule(name)))]
        )
    )


@schedule_app.command("delete")
def schedule_delete(
    name: Annotated[str, typer.Argument()],
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Delete a schedule (tasks it already created stay)."""
    _run(_with_client(address, namespace, lambda c: c.delete_schedule(name)))
    out.print(f"deleted {escape(name)}")


# ---------------------------------------------------------------------- status


@app.command()
def status(
    buckets: Annotated[
        int,
        typer.Option(
            "--buckets",
            envvar=_env("STATUS_BUCKETS"),
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
    cluster = _run(_with_client(address, DEFAULT_NAMESPACE, lambda c: c.status(buckets)))
    if as_json:
        _print_json(cluster)
        return
    out.print(
        f"cluster [bold]{escape(cluster.cluster or '-')}[/], answered by "
        f"{escape(cluster.node_id)} at {_when(cluster.now)}; {cluster.partitions} partitions, "
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
        table.add_row(str(b.bucket), _when(b.starts_at), str(b.pending))
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


# ---------------------------------------------------------------------- worker


def _import_handlers(module: str) -> dict[str, Handler]:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to you are importable
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise typer.BadParameter(
            f"cannot import {module!r}: {exc}", param_hint="--module"
        ) from None
    handlers = getattr(mod, "HANDLERS", None)
    if not isinstance(handlers, dict) or not handlers:
        raise typer.BadParameter(
            f"{module} must define HANDLERS = {{'queue': handler, ...}}", param_hint="--module"
        )
    bad = [q for q, h in handlers.items() if not isinstance(q, str) or not callable(h)]
    if bad:
        raise typer.BadParameter(
            f"{module}.HANDLERS: {bad!r} are not queue → callable", param_hint="--module"
        )
    return handlers


def _select_handlers(module: str | None, queues: Sequence[str]) -> dict[str, Handler]:
    if module is None:
        if not queues:
            raise typer.BadParameter(
                "name the queues to serve (or give --module)", param_hint="--queue"
            )
        return handlers_for(queues)
    handlers = _import_handlers(module)
    missing = [q for q in queues if q not in handlers]
    if missing:
        raise typer.BadParameter(
            f"{module}.HANDLERS has no handler for {', '.join(missing)} "
            f"(it has {', '.join(handlers)})",
            param_hint="--queue",
        )
    return {q: handlers[q] for q in queues} if queues else handlers


@app.command()
def worker(
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            envvar=_env("WORKER_QUEUES"),
            help="A queue to serve (repeat for more; env: space-separated).",
        ),
    ] = None,
    module: Annotated[
        str | None,
        typer.Option(
            "--module",
            "-m",
            envvar=_env("WORKER_MODULE"),
            help="Import HANDLERS = {queue: handler} from this module [default: the demo handler].",
        ),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-c",
            envvar=_env("WORKER_CONCURRENCY"),
            min=1,
            help="Tasks run at once.",
        ),
    ] = 10,
    worker_id: Annotated[
        str | None,
        typer.Option(
            "--worker-id",
            envvar=_env("WORKER_ID"),
            help="Name in leases and logs [default: host-pid].",
        ),
    ] = None,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Run a worker until Ctrl-C or SIGTERM (in-flight tasks finish or are released).

    Example: chronoq worker --queue emails --module myapp.handlers --concurrency 20
    """
    handlers = _select_handlers(module, queue or [])
    stats = _run(_work(address, namespace, handlers, concurrency, worker_id))
    out.print(
        f"worker stopped: claimed {stats.claimed}, succeeded {stats.succeeded}, "
        f"failed {stats.failed}, released {stats.released}, lost {stats.lost}"
    )


async def _work(
    address: str,
    namespace: str,
    handlers: dict[str, Handler],
    concurrency: int,
    worker_id: str | None,
) -> WorkerStats:
    async with _make_client(address, namespace) as client:
        await client.wait_ready()
        runner = Worker(client, handlers, concurrency=concurrency, worker_id=worker_id)
        runner.install_signal_handlers()
        err.print(
            f"worker {runner.worker_id} serving {', '.join(handlers)} on {address} (Ctrl-C to stop)"
        )
        return await runner.run()


# ---------------------------------------------------------------------- demo


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    tasks: int
    over: timedelta
    workers: int
    concurrency: int
    fail_rate: float
    data_dir: Path
    seed: int
    nodes: int = 3

    @property
    def deadline(self) -> float:
        return self.over.total_seconds() + 60.0


@app.command()
def demo(
    tasks: Annotated[
        int, typer.Option(envvar=_env("DEMO_TASKS"), min=1, help="Tasks to submit.")
    ] = 3000,
    over: Annotated[
        timedelta,
        typer.Option(
            parser=_duration,
            metavar="DURATION",
            envvar=_env("DEMO_OVER"),
            show_default="60s",
            help="Spread run_at uniformly over this long.",
        ),
    ] = timedelta(seconds=60),
    workers: Annotated[
        int, typer.Option(envvar=_env("DEMO_WORKERS"), min=1, help="Workers (in-process).")
    ] = 4,
    concurrency: Annotated[
        int, typer.Option(envvar=_env("DEMO_CONCURRENCY"), min=1, help="Tasks at once per worker.")
    ] = 50,
    fail_rate: Annotated[
        float,
        typer.Option(
            envvar=_env("DEMO_FAIL_RATE"),
            min=0.0,
            max=1.0,
            help="Share of tasks that fail at least once (a tenth of them fatally).",
        ),
    ] = 0.05,
    data_dir: DataDirOpt = Path(".chronoq"),
    seed: Annotated[
        int, typer.Option(envvar=_env("DEMO_SEED"), help="Seed of the failure pattern.")
    ] = 0,
    nodes: Annotated[
        int,
        typer.Option(
            envvar=_env("DEMO_NODES"),
            min=1,
            max=16,
            help="Scheduler nodes: more than one is a cluster on an embedded etcd, a process "
            "per node; 1 runs a single node in this process.",
        ),
    ] = 3,
) -> None:
    """A one-command tour: a local cluster on the embedded stack, timed tasks, workers,
    retries, a dead-letter queue.

    Uses a fresh database in the embedded PostgreSQL for each run and drops it at the end.
    Example: chronoq demo --tasks 300 --over 5s --workers 2 --nodes 3
    """
    options = DemoOptions(tasks, over, workers, concurrency, fail_rate, data_dir, seed, nodes)
    raise typer.Exit(_run(_demo(options)))


async def _demo(opts: DemoOptions) -> int:
    stop = _stop_event()
    database = f"demo_{datetime.now(UTC):%Y%m%d_%H%M%S}_{os.getpid()}"
    settings = DevStackSettings(
        data_dir=opts.data_dir,
        port=0,
        database=database,
        drop_database=True,
        nodes=opts.nodes,
    )
    what = "a node" if opts.nodes == 1 else f"etcd and {opts.nodes} nodes"
    err.print(f"starting {what} on the embedded stack in {opts.data_dir} (database {database}) …")
    async with DevStack(settings) as stack:
        err.print(
            f"nodes on {', '.join(stack.addresses)}; submitting {opts.tasks} tasks over "
            f"{format_duration(opts.over)} to {opts.workers} workers"
        )
        started = time.monotonic()
        payloads = demo_payloads(opts.tasks, fail_rate=opts.fail_rate, seed=opts.seed)
        async with Client(stack.address, timeout=60) as client:
            await _submit_demo(client, payloads, opts.over)
            async with _demo_workers(stack.addresses, opts):
                finished = await _watch(stack, opts, stop)
            summary = summarize([t async for t in client.iter_tasks(queue=DEMO_QUEUE)])
            members = (await client.status(bucket_horizon=0)).members
        wall = time.monotonic() - started
    out.print(_summary_table(summary, payloads, wall, members))
    return _verdict(summary, finished, stop, opts)


async def _submit_demo(client: Client, payloads: list[DemoPayload], over: timedelta) -> None:
    now = datetime.now(UTC)
    specs = [
        NewTask(
            queue=DEMO_QUEUE,
            run_at=now + over * (i + 1) / len(payloads),
            payload=p.encode(),
            idempotency_key=f"demo-{p.n}",
            max_attempts=3,
            backoff_initial=timedelta(milliseconds=200),
            backoff_max=timedelta(seconds=2),
        )
        for i, p in enumerate(payloads)
    ]
    for start in range(0, len(specs), SUBMIT_BATCH):
        await client.submit_ids(specs[start : start + SUBMIT_BATCH])


@contextlib.asynccontextmanager
async def _demo_workers(addresses: list[str], opts: DemoOptions) -> AsyncIterator[list[Worker]]:
    """Workers spread over the nodes: any node serves any task."""
    async with contextlib.AsyncExitStack() as resources:
        workers = []
        for i in range(opts.workers):
            address = addresses[i % len(addresses)]
            client = await resources.enter_async_context(Client(address, timeout=30))
            workers.append(
                Worker(
                    client,
                    handlers_for([DEMO_QUEUE]),
                    concurrency=opts.concurrency,
                    worker_id=f"demo-worker-{i + 1}",
                )
            )
        runs = [
            asyncio.create_task(w.run(), name=f"demo-worker-{i + 1}") for i, w in enumerate(workers)
        ]
        try:
            yield workers
        finally:
            for w in workers:
                w.stop()
            await asyncio.gather(*runs, return_exceptions=True)


async def _watch(stack: DevStack, opts: DemoOptions, stop: asyncio.Event) -> bool:
    """Show progress until every task is terminal (True), or the deadline or a signal (False)."""
    deadline = time.monotonic() + opts.deadline
    with _progress() as progress:
        bar = progress.add_task("finished", total=opts.tasks)
        while True:
            counts = await stack.store.count_by_state()
            done = sum(n for s, n in counts.items() if s.terminal)
            progress.update(bar, completed=done, description=_progress_line(counts))
            if done >= opts.tasks:
                return True
            if stop.is_set() or time.monotonic() >= deadline:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.25):
                    await stop.wait()


def _progress_line(counts: dict[TaskState, int]) -> str:
    parts = [f"{s.name.lower()} {counts[s]}" for s in TaskState if counts.get(s)]
    return "finished  (" + ", ".join(parts) + ")"


def _ms(value: timedelta | None) -> str:
    return "-" if value is None else f"{value / timedelta(milliseconds=1):.1f} ms"


def _summary_table(
    summary: DemoSummary, payloads: list[DemoPayload], wall: float, members: list[MemberStatus]
) -> Table:
    fatal = sum(p.fatal for p in payloads)
    exhausted = sum(not p.fatal and p.fail_attempts >= 3 for p in payloads)
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
        ("wall time", f"{wall:.1f} s"),
    ]
    for m in sorted(members, key=lambda m: m.node_id):
        rows.append((f"fired by {m.node_id}", f"{m.fired_total} ({m.owned_partitions} partitions)"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _verdict(summary: DemoSummary, finished: bool, stop: asyncio.Event, opts: DemoOptions) -> int:
    if finished:
        out.print("[green]every task reached SUCCEEDED or DEAD[/]")
        return 0
    missing = ", ".join(f"{n} {s}" for s, n in summary.unfinished.items()) or "none"
    if stop.is_set():
        err.print(f"[yellow]interrupted; unfinished tasks: {missing}[/]")
        return 130
    err.print(
        f"[bold red]error:[/] [red]not finished after {opts.deadline:.0f} s: "
        f"{summary.submitted - summary.succeeded - summary.dead} of {opts.tasks} tasks "
        f"still open ({missing})[/]"
    )
    return 1


# ---------------------------------------------------------------------- bench


@bench_app.command("throughput")
def bench_throughput(
    tasks: Annotated[
        int, typer.Option(envvar=_env("BENCH_TASKS"), min=1, help="Tasks to fire and run.")
    ] = 20000,
    workers: Annotated[int, typer.Option(envvar=_env("BENCH_WORKERS"), min=1)] = 4,
    concurrency: Annotated[int, typer.Option(envvar=_env("BENCH_CONCURRENCY"), min=1)] = 64,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar=_env("BENCH_DATA_DIR"),
            file_okay=False,
            help="Embedded PostgreSQL data directory [default: a temporary one].",
        ),
    ] = None,
    dsn: Annotated[
        str | None,
        typer.Option(
            envvar=_env("BENCH_DSN"), help="Use this PostgreSQL instead of an embedded one."
        ),
    ] = None,
    due_rate: Annotated[
        int, typer.Option(envvar=_env("BENCH_DUE_RATE"), min=1, help="Tasks coming due per second.")
    ] = 1000,
    json_out: Annotated[
        Path | None,
        typer.Option(
            envvar=_env("BENCH_JSON_OUT"), dir_okay=False, help="Also write results here."
        ),
    ] = None,
    pending_sizes: Annotated[
        str,
        typer.Option(
            envvar=_env("BENCH_PENDING_SIZES"),
            help="Comma-separated pending-task counts for the node memory phase (10k, 1M allowed).",
        ),
    ] = "10000,1000000",
    lateness_seconds: Annotated[
        float,
        typer.Option(
            envvar=_env("BENCH_LATENESS_SECONDS"),
            min=0.1,
            help="How long tasks keep coming due in the lateness phase.",
        ),
    ] = 20.0,
    submitters: Annotated[
        str,
        typer.Option(
            envvar=_env("BENCH_SUBMITTERS"), help="Comma-separated counts of concurrent submitters."
        ),
    ] = "1,2,4",
    layouts: Annotated[
        str,
        typer.Option(
            envvar=_env("BENCH_LAYOUTS"), help="Worker layouts end to end: in-process, processes."
        ),
    ] = "in-process,processes",
    phases: Annotated[
        str,
        typer.Option(
            envvar=_env("BENCH_PHASES"),
            help="Phases to run: raw, submit, fire, e2e, lateness, rss.",
        ),
    ] = "raw,submit,fire,e2e,lateness,rss",
    rss_settle_seconds: Annotated[
        float,
        typer.Option(
            envvar=_env("BENCH_RSS_SETTLE_SECONDS"),
            min=0.0,
            help="How long a node fires before its memory is read.",
        ),
    ] = 5.0,
) -> None:
    """Measure submit, firing and claim throughput, and firing cost against pending-set size.

    Example: chronoq bench throughput --tasks 50000 --workers 8 --json-out bench.json
    """
    try:
        module = importlib.import_module("chronoq.bench.throughput")
    except ModuleNotFoundError as exc:
        if exc.name not in ("chronoq.bench", "chronoq.bench.throughput"):
            raise
        _fail("the throughput benchmark (chronoq.bench.throughput) is not part of this install")
    with _reported():
        try:
            module.main(
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
            )
        except ValueError as exc:  # a malformed list option
            _fail(str(exc), 2)


# ---------------------------------------------------------------------- entry point


@bench_app.command("failover")
def bench_failover(
    trials: Annotated[
        int,
        typer.Option(
            envvar=_env("BENCH_TRIALS"),
            min=1,
            max=100,
            help="Trials of each kind (SIGKILL, SIGTERM).",
        ),
    ] = 5,
    nodes: Annotated[int, typer.Option(envvar=_env("BENCH_NODES"), min=2, max=16)] = 3,
    partitions: Annotated[int, typer.Option(envvar=_env("BENCH_PARTITIONS"), min=1)] = 64,
    lease_ttl: Annotated[
        int, typer.Option("--lease-ttl", envvar=_env("LEASE_TTL"), min=2, max=60)
    ] = 2,
    tick_ms: TickMsOpt = 50,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar=_env("BENCH_DATA_DIR"),
            file_okay=False,
            help="Where etcd, PostgreSQL and node logs live [default: a temporary dir].",
        ),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            envvar=_env("BENCH_JSON_OUT"), dir_okay=False, help="Also write results here."
        ),
    ] = None,
) -> None:
    """Failover (SIGKILL → partitions re-owned → first fire) and graceful handoff (SIGTERM)
    times on a real local cluster, over repeated trials: min / median / max.

    Example: chronoq bench failover --trials 5 --lease-ttl 2
    """
    from chronoq.bench.failover import main as failover_main

    with _reported():
        failover_main(
            trials=trials,
            nodes=nodes,
            partitions=partitions,
            lease_ttl=lease_ttl,
            tick_ms=tick_ms,
            data_dir=data_dir,
            json_out=json_out,
        )


@bench_app.command("scan")
def bench_scan(
    sizes: Annotated[
        str,
        typer.Option(
            envvar=_env("BENCH_SIZES"),
            help="Comma-separated pending sizes (100k, 1m, 10m); each also gets a "
            "fired history of the same size.",
        ),
    ] = "100k,1m",
    repeats: Annotated[
        int,
        typer.Option(
            envvar=_env("BENCH_REPEATS"),
            min=1,
            max=100,
            help="Timed runs per strategy (fewer when one is slow).",
        ),
    ] = 5,
    partitions: Annotated[int, typer.Option(envvar=_env("BENCH_PARTITIONS"), min=1)] = 256,
    nodes: Annotated[
        int,
        typer.Option(
            envvar=_env("BENCH_NODES"),
            min=1,
            help="Cluster size: one node owns partitions / nodes of them.",
        ),
    ] = 3,
    order: Annotated[
        str,
        typer.Option(
            envvar=_env("BENCH_ORDER"),
            help="Heap order of the load: scattered (submission order, as in "
            "service) or sorted (run_at order, which flatters run_at indexes).",
        ),
    ] = "scattered",
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar=_env("BENCH_DATA_DIR"),
            file_okay=False,
            help="Embedded PostgreSQL data directory (default: a temporary one).",
        ),
    ] = None,
    dsn: Annotated[
        str | None,
        typer.Option(
            envvar=_env("BENCH_DSN"),
            help="Use this PostgreSQL (a role that may CREATE DATABASE) instead.",
        ),
    ] = None,
    out_dir: Annotated[
        Path,
        typer.Option(
            envvar=_env("BENCH_OUT_DIR"),
            file_okay=False,
            help="Where scan.json, scan-plans.txt and scan.png go.",
        ),
    ] = Path("bench-scan"),
) -> None:
    """Bucketed scans against full-table and run_at-index scans, as pending load grows:
    rows examined, buffers and ms per tick, with EXPLAIN evidence and a log-log plot.

    Example: chronoq bench scan --sizes 100k,1m,10m --out-dir bench-scan
    """
    import asyncpg

    from chronoq.bench.raw import BenchError
    from chronoq.bench.scan import main as scan_main
    from chronoq.embedded.postgres import EmbeddedPostgresError

    with _reported():
        try:
            scan_main(
                sizes=sizes,
                repeats=repeats,
                partitions=partitions,
                nodes=nodes,
                order=order,
                data_dir=data_dir,
                dsn=dsn,
                out_dir=out_dir,
            )
        except ValueError as exc:  # a malformed --sizes, or nodes > partitions
            _fail(str(exc), 2)
        except (BenchError, EmbeddedPostgresError, asyncpg.PostgresError, OSError) as exc:
            _fail(f"bench scan: {exc}")


# ---------------------------------------------------------------------- chaos


@app.command()
def chaos(
    duration: Annotated[
        float, typer.Option(envvar=_env("CHAOS_DURATION"), min=10, help="Seconds of workload.")
    ] = 120.0,
    nodes: Annotated[int, typer.Option(envvar=_env("CHAOS_NODES"), min=2, max=16)] = 3,
    workers: Annotated[int, typer.Option(envvar=_env("CHAOS_WORKERS"), min=1, max=32)] = 3,
    etcd_members: Annotated[int, typer.Option(envvar=_env("CHAOS_ETCD_MEMBERS"), min=1, max=7)] = 3,
    faults: Annotated[
        str,
        typer.Option(
            envvar=_env("CHAOS_FAULTS"),
            metavar="KIND,...",
            help="Fault kinds, or 'all': kill-node, freeze-node (under the lease TTL), "
            "freeze-node-past-ttl (was pause-node), kill-worker, pause-worker, "
            "kill-etcd-member, kill-etcd-leader, restart-postgres, cut-node-etcd, "
            "cut-node-postgres, clock-jump, rolling-restart.",
        ),
    ] = "all",
    seed: Annotated[
        int,
        typer.Option(
            envvar=_env("CHAOS_SEED"), help="Replays the same workload and fault schedule."
        ),
    ] = 1,
    rate: Annotated[
        float, typer.Option(envvar=_env("CHAOS_RATE"), min=1, help="Tasks submitted per second.")
    ] = 50.0,
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out",
            envvar=_env("CHAOS_OUT"),
            file_okay=False,
            help="Where history.json, report.json, timeline.png and logs go.",
        ),
    ] = Path("chaos-out"),
    backend: Annotated[
        str, typer.Option(envvar=_env("CHAOS_BACKEND"), help="local (processes) or docker.")
    ] = "local",
    partitions: Annotated[int, typer.Option(envvar=_env("CHAOS_PARTITIONS"), min=1)] = 64,
    lease_ttl: Annotated[int, typer.Option(envvar=_env("CHAOS_LEASE_TTL"), min=2)] = 2,
    tick_ms: Annotated[int, typer.Option(envvar=_env("CHAOS_TICK_MS"), min=1)] = 50,
    clock_jump_ms: Annotated[int, typer.Option(envvar=_env("CHAOS_CLOCK_JUMP_MS"), min=1)] = 3000,
    cluster: Annotated[
        str,
        typer.Option(
            envvar=_env("CHAOS_CLUSTER"),
            help="The nodes' --cluster (etcd key prefix); docker: the deployment's.",
        ),
    ] = "chaos",
    recheck: Annotated[
        Path | None,
        typer.Option(
            envvar=_env("CHAOS_RECHECK"),
            dir_okay=False,
            help="Check a saved history.json again instead of running.",
        ),
    ] = None,
    compose_project: Annotated[
        str, typer.Option(envvar=_env("CHAOS_COMPOSE_PROJECT"), help="docker: compose project.")
    ] = "chronoq",
    docker_nodes: Annotated[
        str, typer.Option(envvar=_env("CHAOS_DOCKER_NODES"), help="docker: node services.")
    ] = "node-1,node-2,node-3",
    docker_etcd: Annotated[
        str, typer.Option(envvar=_env("CHAOS_DOCKER_ETCD"), help="docker: etcd services.")
    ] = "etcd-1,etcd-2,etcd-3",
    docker_postgres: Annotated[
        str, typer.Option(envvar=_env("CHAOS_DOCKER_POSTGRES"), help="docker: PostgreSQL service.")
    ] = "db",
    docker_dsn: Annotated[
        str | None, typer.Option(envvar=_env("CHAOS_DOCKER_DSN"), help="docker: DSN from here.")
    ] = None,
) -> None:
    """Run a real cluster under a seeded workload and seeded faults, then check an independent
    ledger: none lost, none early, duplicates explained, failover within TTL + a tick, fencing.
    Exits 1 when a check fails.

    Example: chronoq chaos --duration 300 --faults all --seed 7 --out chaos-out
    """
    from chronoq.chaos.docker_backend import DockerUnavailable
    from chronoq.chaos.faults import parse_kinds
    from chronoq.chaos.harness import ChaosOptions, judge, run
    from chronoq.chaos.history import History

    if recheck is not None:
        with _reported():
            verdict = judge(History.load(recheck), recheck.parent, out, plot=True)
        raise typer.Exit(0 if verdict.ok else 1)
    if backend not in ("local", "docker"):
        raise typer.BadParameter("local or docker", param_hint="--backend")
    try:
        kinds = parse_kinds(faults)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--faults") from None
    options = ChaosOptions(
        duration=duration,
        nodes=nodes,
        workers=workers,
        etcd_members=etcd_members,
        faults=tuple(kinds),
        seed=seed,
        rate=rate,
        out=out_dir,
        backend=backend,
        partitions=partitions,
        lease_ttl=lease_ttl,
        tick_ms=tick_ms,
        clock_jump_ms=clock_jump_ms,
        cluster=cluster,
        docker_services={
            "project": compose_project,
            "nodes": tuple(docker_nodes.split(",")),
            "etcd": tuple(docker_etcd.split(",")),
            "postgres": docker_postgres,
            "dsn": docker_dsn,
        }
        if backend == "docker"
        else {},
    )
    with _reported():
        try:
            code = run(options, out)
        except DockerUnavailable as exc:
            err.print(f"[yellow]skipped:[/yellow] {escape(exc.message)}")
            raise typer.Exit(0) from None
        except ValueError as exc:  # a fault the backend cannot inject
            _fail(str(exc), 2)
    raise typer.Exit(code)


# ---------------------------------------------------------------------- lab


@app.command()
def lab(
    port: Annotated[
        int,
        typer.Option(
            "--port",
            envvar=_env("LAB_PORT"),
            min=0,
            max=65535,
            help="HTTP port of the page (0: any free port).",
        ),
    ] = 8080,
    host: Annotated[
        str, typer.Option("--host", envvar=_env("LAB_HOST"), help="Address the page binds.")
    ] = "127.0.0.1",
    nodes: Annotated[int, typer.Option(envvar=_env("LAB_NODES"), min=1, max=8)] = 3,
    partitions: PartitionsOpt = DEFAULT_PARTITIONS,
    lease_ttl: Annotated[
        int,
        typer.Option(
            "--lease-ttl",
            envvar=_env("LEASE_TTL"),
            min=2,
            max=60,
            help="etcd lease TTL of each node: how long a killed owner is missed.",
        ),
    ] = 3,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar=_env("LAB_DATA_DIR"),
            file_okay=False,
            help="Keep etcd, PostgreSQL and node logs here (default: a temporary "
            "directory, removed on exit).",
        ),
    ] = None,
) -> None:
    """An interactive web page over a live local cluster (etcd, PostgreSQL, N nodes, workers)
    on a virtual clock: add load, advance the clock, kill an owner, watch buckets beat scans.

    Example: chronoq lab --port 8080 --nodes 3
    """
    from chronoq.embedded.postgres import EmbeddedPostgresError
    from chronoq.lab.server import LabSettings, run

    settings = LabSettings(
        host=host,
        port=port,
        nodes=nodes,
        partitions=partitions,
        lease_ttl=lease_ttl,
        data_dir=data_dir,
    )
    with _reported():
        try:
            run(settings, announce=lambda line: out.print(escape(line)))
        except (EmbeddedPostgresError, RuntimeError, TimeoutError, OSError) as exc:
            _fail(f"lab: {exc}")


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: run the app, reporting every error as one line."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="chronoq", standalone_mode=False)
    except typer.TyperException as exc:  # usage errors: bad flags, missing arguments
        if type(exc).__name__ != "NoArgsIsHelpError":  # that one already printed the help
            message = escape(exc.format_message())
            err.print(f"[bold red]error:[/bold red] [red]{message}[/red]{_usage_hint(exc)}")
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except ChronoqError as exc:
        err.print(f"[bold red]error:[/bold red] [red]{escape(exc.message)}[/red]")
        sys.exit(1)
    except Exception as exc:
        # The edge of the program: a bug or a driver error nobody translated. One line for
        # people; the traceback for whoever runs with --log-level debug.
        logging.getLogger("chronoq.cli").debug("unexpected error", exc_info=True)
        err.print(
            f"[bold red]error:[/bold red] [red]{escape(type(exc).__name__)}: {escape(str(exc))}"
            "[/red] [dim](--log-level debug shows the traceback)[/dim]"
        )
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_hint(exc: Exception) -> str:
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None)
    return f" [dim](see '{escape(path)} --help')[/dim]" if path else ""


if __name__ == "__main__":
    main()
