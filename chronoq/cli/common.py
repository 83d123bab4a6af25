"""What every command shares: consoles, the options used by several groups, error handling.

Every option has a ``CHRONOQ_*`` environment variable, shown in ``--help``; an option that
means the same thing in several commands has one variable and one range. Options left unset
are None, and the library's default applies. Nothing here imports server code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from chronoq.buckets import MAX_PARTITIONS
from chronoq.client import Client
from chronoq.coordinator.ttl import DEFAULT_LEASE_TTL, MAX_LEASE_TTL, MIN_LEASE_TTL
from chronoq.durations import parse_duration, parse_instant
from chronoq.errors import ChronoqError, InvalidArgument
from chronoq.models import DEFAULT_NAMESPACE

T = TypeVar("T")

DEFAULT_ADDRESS = "127.0.0.1:7070"

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def env(name: str) -> str:
    """The environment variable of an option."""
    return f"CHRONOQ_{name}"


# ---------------------------------------------------------------------- value parsers


def _problem(exc: InvalidArgument) -> str:
    return exc.message.removeprefix(f"{exc.field}: ")


def duration(value: str | timedelta) -> timedelta:
    """Parse a duration option (250ms, 30s, 5m, 1h, 2d)."""
    if isinstance(value, timedelta):  # a default, already parsed
        return value
    try:
        return parse_duration(value)
    except InvalidArgument as exc:
        raise typer.BadParameter(_problem(exc)) from None


def duration_opt(*names: str, envvar: str, help: str) -> Any:
    """A duration option (250ms, 30s, 5m, 1h, 2d) parsed into a ``timedelta``."""
    return typer.Option(*names, parser=duration, metavar="DURATION", envvar=envvar, help=help)


def instant(value: str | datetime) -> datetime:
    """Parse an ISO 8601 time with a zone."""
    if isinstance(value, datetime):
        return value
    try:
        return parse_instant(value)
    except InvalidArgument as exc:
        raise typer.BadParameter(_problem(exc)) from None


# ---------------------------------------------------------------------- shared options

AddressOpt = Annotated[
    str,
    typer.Option(
        "--address",
        "-a",
        envvar=env("ADDRESS"),
        help="gRPC address of any chronoq node, or several comma-separated (round robin, "
        "failing over when one is down).",
    ),
]
NamespaceOpt = Annotated[
    str, typer.Option("--namespace", "-n", envvar=env("NAMESPACE"), help="Task namespace.")
]
JsonOpt = Annotated[
    bool, typer.Option("--json", envvar=env("JSON"), help="Print JSON instead of tables.")
]
HostOpt = Annotated[
    str | None,
    typer.Option(
        "--host",
        envvar=env("HOST"),
        help="Address the node's gRPC server binds.",
    ),
]
PartitionsOpt = Annotated[
    int,
    typer.Option(
        "--partitions",
        envvar=env("PARTITIONS"),
        min=1,
        max=MAX_PARTITIONS,
        help="Hash partitions; fixed when a database is first used.",
    ),
]
BucketSecondsOpt = Annotated[
    int,
    typer.Option(
        "--bucket-seconds", envvar=env("BUCKET_SECONDS"), min=1, help="Time bucket width."
    ),
]
TickMsOpt = Annotated[
    int | None,
    typer.Option(
        "--tick-ms",
        envvar=env("TICK_MS"),
        min=1,
        max=60_000,
        help="Firing loop period.",
    ),
]
PortOpt = Annotated[
    int | None,
    typer.Option(
        "--port",
        envvar=env("PORT"),
        min=0,
        max=65535,
        help="gRPC port (0: any).",
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar=env("DATA_DIR"),
        file_okay=False,
        help="Where the embedded PostgreSQL keeps its data, reused across runs "
        "(.chronoq unless given).",
    ),
]
LeaseTtlOpt = Annotated[
    int | None,
    typer.Option(
        "--lease-ttl",
        envvar=env("LEASE_TTL"),
        min=MIN_LEASE_TTL,
        max=MAX_LEASE_TTL,
        show_default=str(DEFAULT_LEASE_TTL),
        help="etcd lease TTL of each node: seconds of silence before its partitions move "
        "to the others.",
    ),
]


def text_opt(flag: str, name: str, help: str, metavar: str = "PEM") -> Any:
    """A text option (a path or a secret) with its environment variable."""
    return typer.Option(flag, envvar=env(name), metavar=metavar, help=help)


def given(**options: Any) -> dict[str, Any]:
    """The options that were set: what to pass to a library call that has its own defaults."""
    return {name: value for name, value in options.items() if value is not None}


# ---------------------------------------------------------------------- clients

#: Set by the global options (--token, --tls, --tls-ca, --client-cert, --client-key).
CLIENT_OPTIONS: dict[str, Any] = {}


def make_client(address: str, namespace: str = DEFAULT_NAMESPACE, **kwargs: Any) -> Client:
    """A client of a node given by --address, with the global token and TLS options."""
    return Client(address, namespace=namespace, **CLIENT_OPTIONS, **kwargs)


async def with_client(
    address: str, namespace: str, call: Callable[[Client], Coroutine[Any, Any, T]]
) -> T:
    """``call`` with a client of ``address``, closed afterwards."""
    async with make_client(address, namespace) as client:
        return await call(client)


def call(address: str, namespace: str, method: Callable[[Client], Coroutine[Any, Any, T]]) -> T:
    """Run one client call to completion, reporting chronoq errors as one line."""
    return run(with_client(address, namespace, method))


# ---------------------------------------------------------------------- running and errors


def fail(message: str, code: int = 1) -> NoReturn:
    """One red line on stderr, and exit with ``code`` (1: the request failed, 2: bad usage)."""
    err.print(f"[bold red]error:[/bold red] [red]{escape(message)}[/red]")
    raise typer.Exit(code)


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Turn chronoq errors into one red line and exit code 1."""
    try:
        yield
    except ChronoqError as exc:
        fail(exc.message)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` in a new event loop, reporting chronoq errors as one line."""
    with reported():
        return asyncio.run(coro)


def progress(visible: bool = True) -> Progress:
    """A progress bar on stderr."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not visible,
    )
