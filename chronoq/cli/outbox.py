"""``chronoq outbox``: the transactional outbox in the application's own PostgreSQL.

``migrate`` creates its tables; ``relay`` moves committed rows to chronoq until stopped. The
token and TLS options are the global client options (``chronoq --token T outbox relay``).
The outbox modules (and asyncpg) load only when a command runs."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import timedelta
from typing import Annotated

import typer

from chronoq.cli.common import (
    DEFAULT_ADDRESS,
    AddressOpt,
    NamespaceOpt,
    duration_opt,
    env,
    given,
    make_client,
    out,
    run,
)
from chronoq.models import DEFAULT_NAMESPACE

outbox_app = typer.Typer(
    help="The transactional outbox in the application's PostgreSQL.", no_args_is_help=True
)

AppDsnOpt = Annotated[
    str,
    typer.Option(
        "--dsn",
        envvar=env("OUTBOX_DSN"),
        help="The application's PostgreSQL (where chronoq_outbox lives), not chronoq's store.",
    ),
]


def register(app: typer.Typer) -> None:
    """Add ``chronoq outbox`` to ``app``."""
    app.add_typer(outbox_app, name="outbox")


@outbox_app.command("migrate")
def migrate(dsn: AppDsnOpt) -> None:
    """Create (or bring up to date) the outbox tables in the application's database.

    Example: chronoq outbox migrate --dsn postgresql://app@db/app
    """
    from chronoq.outbox import migrate as apply

    applied = run(apply(dsn))
    out.print(
        f"applied outbox migrations {', '.join(map(str, applied))}"
        if applied
        else "the outbox tables are up to date"
    )


@outbox_app.command("relay")
def relay(
    dsn: AppDsnOpt,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    batch_rows: Annotated[
        int | None,
        typer.Option(
            "--batch-rows",
            envvar=env("OUTBOX_BATCH_ROWS"),
            min=1,
            max=5000,
            show_default="500",
            help="Rows per transaction and SubmitBatch.",
        ),
    ] = None,
    batch_bytes: Annotated[
        int | None,
        typer.Option(
            "--batch-bytes",
            envvar=env("OUTBOX_BATCH_BYTES"),
            min=1,
            max=3 * 1024 * 1024,
            show_default="1048576",
            help="Bytes of task specs per transaction (a larger row goes alone).",
        ),
    ] = None,
    poll_interval: Annotated[
        timedelta | None,
        duration_opt(
            "--poll-interval",
            envvar=env("OUTBOX_POLL_INTERVAL"),
            help="Look for rows this often even without a NOTIFY [default: 1s].",
        ),
    ] = None,
) -> None:
    """Move committed outbox rows to chronoq until interrupted (several relays may run).

    Example: chronoq --token T outbox relay --dsn postgresql://app@db/app -a node1:7070,node2:7070
    """
    from chronoq.outbox import Relay

    async def relaying() -> None:
        async with make_client(address, namespace) as client:
            worker = Relay(
                dsn,
                client,
                namespace=namespace,
                **given(
                    batch_rows=batch_rows, batch_bytes=batch_bytes, poll_interval=poll_interval
                ),
            )
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError):
                    loop.add_signal_handler(sig, worker.stop)
            await worker.run()

    run(relaying())
