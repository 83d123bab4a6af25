"""``chronoq console``: the operator's web console over the gRPC API of a running cluster."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from chronoq.cli.common import CLIENT_OPTIONS, DEFAULT_ADDRESS, AddressOpt, env, fail, out, reported
from chronoq.models import DEFAULT_NAMESPACE


def register(app: typer.Typer) -> None:
    """Add ``chronoq console`` to ``app``."""
    app.command()(console)


def console(
    address: AddressOpt = DEFAULT_ADDRESS,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            envvar=env("CONSOLE_HOST"),
            help="Address the console binds (loopback by default; whoever reaches it acts "
            "with your token).",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            "--port", envvar=env("CONSOLE_PORT"), min=0, max=65535, help="HTTP port (0: any)."
        ),
    ] = 8090,
    namespaces: Annotated[
        str,
        typer.Option(
            "--namespaces",
            envvar=env("CONSOLE_NAMESPACES"),
            help="Comma-separated namespaces offered in the page (any other can be typed).",
        ),
    ] = DEFAULT_NAMESPACE,
    refresh: Annotated[
        float,
        typer.Option(
            "--refresh",
            envvar=env("CONSOLE_REFRESH"),
            min=0.5,
            max=60.0,
            help="Seconds between polls of the cluster's status.",
        ),
    ] = 2.0,
) -> None:
    """A web console over a running cluster: members and ownership, queues, tasks, dead
    letters, schedules. It talks to the nodes only through the gRPC API, with the global
    --token and TLS options.

    Example: chronoq --token "$TOKEN" console -a node1:7070,node2:7070 --namespaces a,b
    """
    try:
        from chronoq.console.server import ConsoleSettings, run
    except ImportError as exc:  # aiohttp is an extra
        fail(f"console: {exc.name} is missing; pip install 'chronoq[console]'")
    names = tuple(n.strip() for n in namespaces.split(",") if n.strip())
    with reported():
        settings = ConsoleSettings(
            address=address,
            host=host,
            port=port,
            namespaces=names or (DEFAULT_NAMESPACE,),
            refresh=refresh,
            client_options=dict(CLIENT_OPTIONS),
        )
        run(settings, announce=lambda line: out.print(escape(line)))
