"""Node commands: ``chronoq node`` (run one), ``chronoq node drain`` and ``chronoq config``.

The options become a ``NodeOptions`` and ``settings_from`` turns it into the node's settings;
what is not set takes the library's default. Server code is imported when a node runs, so the
client commands never load it.
"""

from __future__ import annotations

import enum
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from chronoq import tracing
from chronoq.buckets import DEFAULT_BUCKET_SECONDS, DEFAULT_PARTITIONS
from chronoq.cardinality import DEFAULT_METRICS_QUEUES, MAX_METRICS_QUEUES
from chronoq.cli.common import (
    DEFAULT_ADDRESS,
    AddressOpt,
    BucketSecondsOpt,
    HostOpt,
    LeaseTtlOpt,
    PartitionsOpt,
    PortOpt,
    TickMsOpt,
    call,
    env,
    err,
    fail,
    out,
    reported,
    run,
    text_opt,
)
from chronoq.history_slices import MAX_HISTORY_AFTER, MAX_SLICES, MAX_WIDTH
from chronoq.models import DEFAULT_NAMESPACE
from chronoq.redact import MASK, mask_dsn
from chronoq.signals import stop_event
from chronoq.targets import split_addresses

if TYPE_CHECKING:
    from chronoq.config import NodeSettings
    from chronoq.node.node import Node
    from chronoq.node.settings_from import NodeOptions

node_app = typer.Typer(
    help="Run a scheduler node (or `chronoq node drain` one).",
    invoke_without_command=True,
    no_args_is_help=False,
)


def register(app: typer.Typer) -> None:
    """Add ``chronoq node`` and ``chronoq config`` to ``app``."""
    app.command(
        "config", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
    )(config_command)
    app.add_typer(node_app, name="node")


# Auth and TLS of `chronoq node` (server side) and of its etcd; see chronoq.auth, chronoq.tls.
TlsCertOpt = Annotated[
    str | None,
    text_opt("--tls-cert", "TLS_CERT", "Serve the gRPC API over TLS with this certificate chain."),
]
TlsKeyOpt = Annotated[
    str | None, text_opt("--tls-key", "TLS_KEY", "The private key of --tls-cert.")
]
TlsClientCaOpt = Annotated[
    str | None,
    text_opt(
        "--tls-client-ca", "TLS_CLIENT_CA", "Mutual TLS: require client certificates of this CA."
    ),
]
AuthTokensOpt = Annotated[
    str | None,
    text_opt(
        "--auth-tokens",
        "AUTH_TOKENS",
        'Require bearer tokens: a TOML file, [tokens] "tok" = ["namespace", ...] ("*": all).',
        metavar="FILE",
    ),
]
EtcdUserOpt = Annotated[
    str | None, text_opt("--etcd-user", "ETCD_USER", "etcd user name (etcd auth).", metavar="NAME")
]
EtcdPasswordOpt = Annotated[
    str | None,
    text_opt(
        "--etcd-password",
        "ETCD_PASSWORD",
        "etcd password (prefer the environment variable).",
        metavar="PASSWORD",
    ),
]
EtcdPasswordFileOpt = Annotated[
    str | None,
    text_opt(
        "--etcd-password-file",
        "ETCD_PASSWORD_FILE",
        "A file holding the etcd password (mode 0600, ours): the password stays out of argv.",
        metavar="FILE",
    ),
]
EtcdCaOpt = Annotated[
    str | None, text_opt("--etcd-ca", "ETCD_CA", "TLS to etcd, trusting this CA.")
]
EtcdCertOpt = Annotated[
    str | None,
    text_opt("--etcd-cert", "ETCD_CERT", "Client certificate for etcd (--client-cert-auth)."),
]
EtcdKeyOpt = Annotated[
    str | None, text_opt("--etcd-key", "ETCD_KEY", "The private key of --etcd-cert.")
]


class Switch(enum.StrEnum):
    on = "on"
    off = "off"


def _num_opt(flag: str, name: str, help: str, *, min: float = 0, max: float | None = None) -> Any:
    """A number option with bounds and its environment variable."""
    return typer.Option(flag, envvar=env(name), min=min, max=max, help=help)


@node_app.command("drain")
def node_drain(address: AddressOpt = DEFAULT_ADDRESS) -> None:
    """Hand a node's partitions to the others and take no more; it keeps serving the API,
    so workers finish what they hold. Stop it afterwards.

    Example: chronoq node drain --address 127.0.0.1:7071
    """
    if len(split_addresses(address)) != 1:
        raise typer.BadParameter(
            "drain one node at a time: give its address only", param_hint="--address"
        )
    released = call(address, DEFAULT_NAMESPACE, lambda c: c.drain())
    out.print(f"drained {address}: released {len(released)} partitions")


@node_app.callback()
def node(
    ctx: typer.Context,
    dsn: Annotated[
        str | None,
        typer.Option("--dsn", envvar=env("DSN"), help="PostgreSQL DSN of the task store."),
    ] = None,
    store_shard: Annotated[
        list[str] | None,
        typer.Option(
            "--store-shard",
            envvar=env("STORE_SHARD"),
            metavar="DSN",
            help="DSN of one more store shard (repeat: shard-1, shard-2, ... in order; "
            "CHRONOQ_STORE_SHARD: space-separated). Needs --etcd. A shard named by the "
            "cluster's map but not here is reached by its DSN in etcd, with the password "
            "from the libpq password file (PGPASSFILE).",
        ),
    ] = None,
    host: HostOpt = None,
    port: PortOpt = None,
    node_id: Annotated[
        str | None,
        typer.Option(
            "--node-id", envvar=env("NODE_ID"), help="Stable node name [default: random]."
        ),
    ] = None,
    partitions: PartitionsOpt = DEFAULT_PARTITIONS,
    bucket_seconds: BucketSecondsOpt = DEFAULT_BUCKET_SECONDS,
    tick_ms: TickMsOpt = None,
    wheel_horizon_ms: Annotated[
        int | None,
        _num_opt(
            "--wheel-horizon-ms",
            "WHEEL_HORIZON_MS",
            "Owners hold the tasks due this far ahead in a timing wheel and fire each at its "
            "instant; the tick fires the rest (0: the tick alone).",
            max=60_000,
        ),
    ] = None,
    catch_all_ms: Annotated[
        int | None,
        _num_opt(
            "--catch-all-ms",
            "CATCH_ALL_MS",
            "With the timing wheel on: how often the tick, the catch-all for what the wheel "
            "does not hold, runs while it finds nothing late.",
            min=1,
            max=60_000,
        ),
    ] = None,
    max_payload_bytes: Annotated[
        int | None,
        _num_opt("--max-payload-bytes", "MAX_PAYLOAD_BYTES", "Largest payload a submit may carry."),
    ] = None,
    horizon_days: Annotated[
        int | None,
        _num_opt("--horizon-days", "HORIZON_DAYS", "How far ahead a task may be scheduled.", min=1),
    ] = None,
    etcd: Annotated[
        str | None,
        typer.Option(
            "--etcd",
            envvar=env("ETCD"),
            metavar="HOST:PORT,...",
            help="etcd endpoints: join a cluster [default: own every partition alone].",
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", envvar=env("CLUSTER"), help="Cluster name in etcd."),
    ] = None,
    lease_ttl: LeaseTtlOpt = None,
    virtual_clock: Annotated[
        bool,
        typer.Option(
            "--virtual-clock",
            envvar=env("VIRTUAL_CLOCK"),
            help="Fire by the cluster's shared virtual clock in etcd (tests, the lab).",
        ),
    ] = False,
    clock_offset_ms: Annotated[
        int,
        typer.Option(
            "--clock-offset-ms",
            envvar=env("CLOCK_OFFSET_MS"),
            hidden=True,
            help="Run the node's clock this far ahead (or behind): the chaos "
            "harness's clock-jump fault.",
        ),
    ] = 0,
    clock_offset_file: Annotated[
        Path | None,
        typer.Option(
            "--clock-offset-file",
            envvar=env("CLOCK_OFFSET_FILE"),
            hidden=True,
            dir_okay=False,
            help="Shift the node's clock by the milliseconds this file holds, reread as it "
            "changes: the chaos harness's clock-drift fault.",
        ),
    ] = None,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-endpoint",
            envvar=env("OTLP_ENDPOINT"),
            help="Export OpenTelemetry traces over OTLP/gRPC to this URL (e.g. "
            "http://collector:4317; also OTEL_EXPORTER_OTLP_ENDPOINT). Needs chronoq[tracing]. "
            "Off by default.",
        ),
    ] = None,
    max_clock_offset_ms: Annotated[
        int | None,
        _num_opt(
            "--max-clock-offset-ms",
            "MAX_CLOCK_OFFSET_MS",
            "With --etcd: off by more than this from PostgreSQL's clock, the node hands "
            "its partitions off and reports NOT_SERVING until its clock is right (0: never "
            "checked).",
        ),
    ] = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_client_ca: TlsClientCaOpt = None,
    auth_tokens: AuthTokensOpt = None,
    etcd_user: EtcdUserOpt = None,
    etcd_password: EtcdPasswordOpt = None,
    etcd_password_file: EtcdPasswordFileOpt = None,
    etcd_ca: EtcdCaOpt = None,
    etcd_cert: EtcdCertOpt = None,
    etcd_key: EtcdKeyOpt = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(
            "--metrics-host",
            envvar=env("METRICS_HOST"),
            help="Address of the Prometheus /metrics endpoint.",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        _num_opt(
            "--metrics-port",
            "METRICS_PORT",
            "Serve Prometheus metrics on this port [default: off].",
        ),
    ] = None,
    metrics_token_file: Annotated[
        str | None,
        text_opt(
            "--metrics-token-file",
            "METRICS_TOKEN_FILE",
            "Scrapes must send this file's bearer token (or match its sha256:<hex> digest); "
            "mode 0600, ours. Needed unless --metrics-host is loopback.",
            metavar="FILE",
        ),
    ] = None,
    metrics_token: Annotated[
        str | None,
        text_opt(
            "--metrics-token",
            "METRICS_TOKEN",
            "The bearer token itself, for containers (prefer the environment variable: a "
            "command line is visible to every account).",
            metavar="TOKEN",
        ),
    ] = None,
    metrics_insecure: Annotated[
        bool,
        typer.Option(
            "--metrics-insecure",
            envvar=env("METRICS_INSECURE"),
            help="Serve /metrics on a non-loopback --metrics-host without a token: whoever "
            "reaches the port reads it.",
        ),
    ] = False,
    metrics_queues: Annotated[
        int | None,
        _num_opt(
            "--metrics-queues",
            "METRICS_QUEUES",
            "Queues with depth series of their own (the busiest); the rest are summed "
            f'under queue="(other)" [default: {DEFAULT_METRICS_QUEUES}].',
            max=MAX_METRICS_QUEUES,
        ),
    ] = None,
    retention_days: Annotated[
        float | None,
        _num_opt(
            "--retention-days",
            "RETENTION_DAYS",
            "Keep SUCCEEDED/CANCELLED/SKIPPED tasks this long (0: forever).",
        ),
    ] = None,
    dead_retention_days: Annotated[
        float | None,
        _num_opt(
            "--dead-retention-days",
            "DEAD_RETENTION_DAYS",
            "Keep DEAD tasks (the DLQ) this long (0: forever).",
        ),
    ] = None,
    history_after_s: Annotated[
        float | None,
        _num_opt(
            "--history-after-s",
            "HISTORY_AFTER_S",
            "Move finished tasks from the live table into the task history this long after "
            "they finish (0: at the next retention pass; default 60).",
            max=MAX_HISTORY_AFTER.total_seconds(),
        ),
    ] = None,
    history_slice_hours: Annotated[
        float | None,
        _num_opt(
            "--history-slice-hours",
            "HISTORY_SLICE_HOURS",
            "Drop the task history in whole time slices this wide (0: a day, or wider when "
            f"the retention would need more than {MAX_SLICES} slices).",
            max=MAX_WIDTH / timedelta(hours=1),
        ),
    ] = None,
    submit_quota: Annotated[
        float | None,
        _num_opt(
            "--submit-quota",
            "SUBMIT_QUOTA",
            "Submits per second per namespace on this node "
            "(RESOURCE_EXHAUSTED above) [default: unlimited].",
        ),
    ] = None,
    submit_quota_burst: Annotated[
        float | None,
        _num_opt(
            "--submit-quota-burst",
            "SUBMIT_QUOTA_BURST",
            "Burst of the submit quota [default: 1 s worth].",
            min=1,
        ),
    ] = None,
    long_polls_per_namespace: Annotated[
        int | None,
        _num_opt(
            "--long-polls-per-namespace",
            "LONG_POLLS_PER_NAMESPACE",
            "Long-polling claims one namespace may hold open on this node (RESOURCE_EXHAUSTED "
            "above).",
            min=1,
        ),
    ] = None,
    long_polls_per_node: Annotated[
        int | None,
        _num_opt(
            "--long-polls-per-node",
            "LONG_POLLS_PER_NODE",
            "Long-polling claims this node holds open, all namespaces together.",
            min=1,
        ),
    ] = None,
    ready_notices: Annotated[
        Switch | None,
        typer.Option(
            "--ready-notices",
            envvar=env("READY_NOTICES"),
            help="on: tell the other nodes through PostgreSQL NOTIFY which queues have new "
            "ready tasks (the default); off: they find them by polling.",
        ),
    ] = None,
    handoff: Annotated[
        Switch | None,
        typer.Option(
            "--handoff",
            envvar=env("HANDOFF"),
            help="on: the timing wheel fires a task straight to a worker stream of this node "
            "that waits on its queue (the default); off: fired tasks wait for a claim.",
        ),
    ] = None,
    schedules_per_namespace: Annotated[
        int | None,
        _num_opt(
            "--schedules-per-namespace",
            "SCHEDULES_PER_NAMESPACE",
            "Schedules one namespace may hold.",
            min=1,
        ),
    ] = None,
    queue_limits_per_namespace: Annotated[
        int | None,
        _num_opt(
            "--queue-limits-per-namespace",
            "QUEUE_LIMITS_PER_NAMESPACE",
            "Queue dispatch limits one namespace may set.",
            min=1,
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
    _serve(ctx.params, virtual_clock=virtual_clock, clock_offset_ms=clock_offset_ms,
           clock_offset_file=clock_offset_file)


def node_options(params: dict[str, Any]) -> NodeOptions:
    """The ``NodeOptions`` of a parsed ``chronoq node`` command line (``ctx.params``)."""
    from chronoq.node.settings_from import NodeOptions

    given = {k: v for k, v in params.items() if k in NodeOptions.names()}
    if params.get("store_shard"):
        given["store_shards"] = tuple(params["store_shard"])
    for switch in ("ready_notices", "handoff"):
        if given[switch] is not None:
            given[switch] = given[switch] is Switch.on
    return NodeOptions(**given)


def _serve(
    params: dict[str, Any], *, virtual_clock: bool, clock_offset_ms: int,
    clock_offset_file: Path | None = None,
) -> None:
    from chronoq.node.settings_from import settings_from

    options = node_options(params)
    if options.etcd is None and any(options.etcd_access.values()):
        raise typer.BadParameter("etcd credentials and TLS need --etcd too", param_hint="--etcd-*")
    with reported():
        settings = settings_from(options)
        tracing.configure_from_env("chronoq-node", params.get("otlp_endpoint"), strict=True)
    offset = timedelta(milliseconds=clock_offset_ms)
    run(_run_node(settings, virtual_clock=virtual_clock, clock_offset=offset,
                  clock_offset_file=clock_offset_file))


async def _run_node(
    settings: NodeSettings, *, virtual_clock: bool, clock_offset: timedelta,
    clock_offset_file: Path | None = None,
) -> None:
    from chronoq.node.serve import serve

    def started(node: Node) -> None:
        out.print(f"node {settings.node_id} serving on {node.address} (Ctrl-C to stop)")

    try:
        await serve(
            settings,
            stop_event(),
            virtual_clock=virtual_clock,
            clock_offset=clock_offset,
            clock_offset_file=clock_offset_file,
            started=started,
            stopping=lambda: err.print("stopping …"),
        )
    except (RuntimeError, OSError) as exc:  # grpc bind failures are RuntimeErrors
        fail(f"node could not start on {settings.host}:{settings.port}: {exc}")


# ---------------------------------------------------------------------- config


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


_SOURCE_NAMES = {
    "COMMANDLINE": "flag",
    "ENVIRONMENT": "env",
    "DEFAULT_MAP": "file",
    "DEFAULT": "default",
    "PROMPT": "prompt",
}
#: Settings whose whole value is a secret, shown as ``MASK``: ``*password`` and these (any
#: other has the passwords of its DSN or URLs masked by ``mask_dsn``; paths stay readable).
_SECRET = frozenset({"token", "metrics_token"})


def _print_sources(ctx: typer.Context) -> None:
    """The effective value of every option of a command, and where it came from."""
    from chronoq.node.settings_from import shown_defaults

    defaults = shown_defaults()
    table = Table(title=f"chronoq {ctx.info_name}: effective settings", title_justify="left")
    for column in ("setting", "value", "from"):
        table.add_column(column)
    for param in ctx.command.params:
        name = param.name or ""
        if name in ("show_config", "help") or param.param_type_name != "option":
            continue
        value = ctx.params.get(name)
        if value is None:
            value = defaults.get(name)
        source = ctx.get_parameter_source(name)
        origin = _SOURCE_NAMES.get(source.name if source else "DEFAULT", "default")
        if origin == "env" and param.envvar:
            origin = f"env {param.envvar}"
        shown = "-" if value is None else _shown(name, value)
        table.add_row(param.opts[0], escape(shown), origin)
    out.print(table)


def _redact(name: str, value: str) -> str:
    """A setting's value fit to print: secrets masked wherever they sit."""
    if name in _SECRET or name.endswith("password"):
        return MASK
    return mask_dsn(value)


def _shown(name: str, value: object) -> str:
    """A setting's value fit to print; each item of a list masked on its own (a DSN's
    password inside ``str(list)`` would not match ``mask_dsn``'s URL form)."""
    if isinstance(value, list | tuple):
        return " ".join(_redact(name, str(v)) for v in value) or "-"
    return _redact(name, str(value))
