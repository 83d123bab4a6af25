"""``chronoq worker``: run the handlers of a module (or the demo handler) on some queues."""

from __future__ import annotations

from typing import Annotated

import typer

from chronoq import tracing
from chronoq.cli.common import (
    DEFAULT_ADDRESS,
    AddressOpt,
    NamespaceOpt,
    env,
    err,
    make_client,
    out,
    reported,
    run,
)
from chronoq.client import Worker, WorkerStats
from chronoq.client.context import Handler
from chronoq.client.handlers import HandlerChoiceError, select_handlers
from chronoq.heap import freeze_startup_heap
from chronoq.models import DEFAULT_NAMESPACE


def register(app: typer.Typer) -> None:
    """Add ``chronoq worker`` to ``app``."""
    app.command()(worker)


def worker(
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            envvar=env("WORKER_QUEUES"),
            help="A queue to serve (repeat for more; env: space-separated).",
        ),
    ] = None,
    module: Annotated[
        str | None,
        typer.Option(
            "--module",
            "-m",
            envvar=env("WORKER_MODULE"),
            help="Import HANDLERS = {queue: handler} from this module [default: the demo handler].",
        ),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-c",
            envvar=env("WORKER_CONCURRENCY"),
            min=1,
            help="Tasks run at once.",
        ),
    ] = 10,
    prefetch: Annotated[
        int | None,
        typer.Option(
            "--prefetch",
            envvar=env("WORKER_PREFETCH"),
            min=0,
            help="Most tasks held leased beyond those running, so a freed slot starts the next "
            "at once; only what the slots start within 20 ms at the handlers' pace is held "
            "[default: 4 x concurrency; 0: none].",
        ),
    ] = None,
    worker_id: Annotated[
        str | None,
        typer.Option(
            "--worker-id",
            envvar=env("WORKER_ID"),
            help="Name in leases and logs [default: host-pid].",
        ),
    ] = None,
    rate: Annotated[
        list[str] | None,
        typer.Option(
            "--rate",
            envvar=env("WORKER_RATES"),
            metavar="QUEUE=PER_SECOND",
            help="Start at most this many tasks of a queue per second (repeat for more).",
        ),
    ] = None,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-endpoint",
            envvar=env("OTLP_ENDPOINT"),
            help="Export OpenTelemetry traces (a span per handler run) over OTLP/gRPC to this "
            "URL (also OTEL_EXPORTER_OTLP_ENDPOINT). Needs chronoq[tracing]. Off by default.",
        ),
    ] = None,
) -> None:
    """Run a worker until Ctrl-C or SIGTERM (in-flight tasks finish or are released).

    Example: chronoq worker --queue emails --module myapp.handlers --concurrency 20
    """
    try:
        handlers = select_handlers(module, queue or [])
    except HandlerChoiceError as exc:
        raise typer.BadParameter(exc.message, param_hint=f"--{exc.option}") from None
    rates = _rates(rate or [], handlers)
    with reported():
        tracing.configure_from_env("chronoq-worker", otlp_endpoint, strict=True)
    stats = run(_work(address, namespace, handlers, concurrency, worker_id, rates, prefetch))
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
    rates: dict[str, float] | None = None,
    prefetch: int | None = None,
) -> WorkerStats:
    async with make_client(address, namespace) as client:
        await client.wait_ready()
        runner = Worker(
            client, handlers, concurrency=concurrency, worker_id=worker_id, rates=rates,
            prefetch=prefetch,
        )
        runner.install_signal_handlers()
        freeze_startup_heap()  # handlers imported, client connected: collections skip it all
        err.print(
            f"worker {runner.worker_id} serving {', '.join(handlers)} on {address} (Ctrl-C to stop)"
        )
        return await runner.run()


def _rates(given: list[str], handlers: dict[str, Handler]) -> dict[str, float]:
    """``QUEUE=PER_SECOND`` options as a map; a usage error says what is wrong."""
    rates: dict[str, float] = {}
    for item in given:
        queue, sep, value = item.partition("=")
        try:
            per_second = float(value) if sep else float("nan")
        except ValueError:
            per_second = float("nan")
        if not (per_second > 0 and per_second != float("inf")):
            raise typer.BadParameter(
                f"{item!r}: write QUEUE=PER_SECOND with a number above 0, e.g. emails=50",
                param_hint="--rate",
            )
        if queue not in handlers:
            raise typer.BadParameter(
                f"{queue!r} is not a queue this worker serves ({', '.join(handlers)})",
                param_hint="--rate",
            )
        rates[queue] = per_second
    return rates
