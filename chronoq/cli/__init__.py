"""The ``chronoq`` command line: run a dev stack or a node, submit and inspect tasks, run workers.

One module per group of commands; each command parses its options and calls the library.
Every option has a ``CHRONOQ_*`` environment variable, shown in ``--help``. Options that mean
the same thing everywhere share one (``CHRONOQ_ADDRESS``, ``CHRONOQ_DSN``, ``CHRONOQ_PORT``,
``CHRONOQ_LEASE_TTL``); options of one command carry its name (``CHRONOQ_SUBMIT_PRIORITY``,
``CHRONOQ_DEMO_TASKS``). The client commands load no server code: the commands that run
servers import them when they run.

Errors are one red line on stderr and exit code 1 (the request failed) or 2 (bad usage),
never a traceback.
"""

from __future__ import annotations

# First, before anything loads grpc: dev, demo and lab fork servers from this process (see
# chronoq.forking). A command-line process is its own; the library never does this.
from chronoq.forking import disable_grpc_fork_handlers

disable_grpc_fork_handlers()

import enum  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import tomllib  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import typer  # noqa: E402
from rich.logging import RichHandler  # noqa: E402
from rich.markup import escape  # noqa: E402

from chronoq import __version__  # noqa: E402
from chronoq.cli import (  # noqa: E402
    bench,
    bulk,
    chaos,
    console,
    counts,
    dev,
    etcd,
    node,
    outbox,
    queues,
    schedules,
    status,
    store,
    tasks,
    worker,
)
from chronoq.cli.common import CLIENT_OPTIONS, env, err, fail, text_opt  # noqa: E402
from chronoq.cli.extras import missing_extra  # noqa: E402
from chronoq.errors import ChronoqError  # noqa: E402

__all__ = ["app", "main"]

app = typer.Typer(
    name="chronoq",
    help="chronoq: a distributed scheduler for timed tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class LogLevel(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def _show_version(value: bool) -> None:
    """``--version``: the installed distribution's version (from its git tag), then exit."""
    if value:
        typer.echo(f"chronoq {__version__}")
        raise typer.Exit()


@app.callback()
def _configure(
    ctx: typer.Context,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Show the installed chronoq's version and exit.",
        ),
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar=env("CONFIG"),
            dir_okay=False,
            help="A TOML file of settings: a table per command, e.g. [node]; "
            "flags and CHRONOQ_* variables override it.",
        ),
    ] = None,
    log_level: Annotated[
        LogLevel, typer.Option("--log-level", envvar=env("LOG_LEVEL"), help="Log verbosity.")
    ] = LogLevel.warning,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar=env("TOKEN"), help="Bearer token for nodes that require one."
        ),
    ] = None,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls", envvar=env("TLS"), help="Talk TLS to nodes, trusting the system's CAs."
        ),
    ] = False,
    tls_ca: Annotated[
        str | None, text_opt("--tls-ca", "TLS_CA", "Talk TLS to nodes, trusting this CA.")
    ] = None,
    client_cert: Annotated[
        str | None, text_opt("--client-cert", "CLIENT_CERT", "Client certificate for mutual TLS.")
    ] = None,
    client_key: Annotated[
        str | None, text_opt("--client-key", "CLIENT_KEY", "The private key of --client-cert.")
    ] = None,
) -> None:
    """chronoq: a distributed scheduler for timed tasks (PostgreSQL buckets, etcd ownership).

    Client options (--token, --tls, --tls-ca, --client-cert, --client-key) go before the
    command: chronoq --token T --tls-ca ca.pem submit emails.
    """
    CLIENT_OPTIONS.update(
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
        fail(f"cannot read --config {path}: {exc.strerror}", 2)
    except tomllib.TOMLDecodeError as exc:
        fail(f"--config {path} is not valid TOML: {exc}", 2)
    tables: dict[str, Any] = {}
    for command, table in data.items():
        if not isinstance(table, dict):
            fail(f"--config {path}: {command!r} must be a table like [node]", 2)
        tables[command] = {key.replace("-", "_"): value for key, value in table.items()}
    return tables


# The order of --help: the local stack, the node, tasks, schedules, status, workers, tools.
dev.register(app)
node.register(app)
etcd.register(app)
tasks.register(app)
bulk.register(app)
schedules.register(app)
queues.register(app)
counts.register(app)
status.register(app)
store.register(app)
outbox.register(app)
worker.register(app)
bench.register(app)
chaos.register(app)
console.register(app)


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
        if isinstance(exc, ModuleNotFoundError):  # a command of an extra on the base install
            hint = missing_extra(exc, sys.argv[1:] if argv is None else argv)
            if hint is not None:
                err.print(f"[bold red]error:[/bold red] [red]{escape(hint)}[/red]")
                sys.exit(1)
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
