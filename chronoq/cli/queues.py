"""Queue settings commands: ``chronoq queue set|pause|resume|show|list``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chronoq.cli.common import DEFAULT_ADDRESS, AddressOpt, NamespaceOpt, call, env, fail, out
from chronoq.cli.render import utc
from chronoq.models import DEFAULT_NAMESPACE
from chronoq.queue_settings import QueueSettings

queue_app = typer.Typer(
    help="Queue settings: pause and resume a queue, limit it per concurrency key.",
    no_args_is_help=True,
)

QueueArg = Annotated[str, typer.Argument(help="Queue name.")]


def register(app: typer.Typer) -> None:
    """Add ``chronoq queue`` to ``app``."""
    app.add_typer(queue_app, name="queue")


def _limit(value: float) -> str:
    return "-" if not value else f"{value:g}"


def settings_table(settings: Sequence[QueueSettings]) -> Table:
    """One line per queue: paused (since when) and its per-key limits."""
    table = Table(title="queues", title_justify="left")
    for column in ("queue", "state", "paused since (UTC)", "max running/key", "max starts/key/s"):
        table.add_column(column)
    for s in settings:
        table.add_row(
            escape(s.queue),
            "paused" if s.paused else "running",
            utc(s.paused_at) if s.paused_at is not None else "-",
            _limit(s.max_running_per_key),
            _limit(s.max_starts_per_key),
        )
    return table


@queue_app.command("set")
def queue_set(
    queue: QueueArg,
    max_running_per_key: Annotated[
        int | None,
        typer.Option(
            "--max-running-per-key",
            envvar=env("MAX_RUNNING_PER_KEY"),
            help="Tasks of one concurrency key running at once, cluster-wide (0: no limit).",
        ),
    ] = None,
    max_starts_per_key: Annotated[
        float | None,
        typer.Option(
            "--max-starts-per-key",
            envvar=env("MAX_STARTS_PER_KEY"),
            help="Tasks of one concurrency key started per second (0: no limit).",
        ),
    ] = None,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Limit a queue per concurrency key; an option left out keeps its value.

    Example: chronoq queue set emails --max-running-per-key 1 --max-starts-per-key 5
    """
    if max_running_per_key is None and max_starts_per_key is None:
        fail("give --max-running-per-key, --max-starts-per-key or both", 2)
    if max_running_per_key is not None and max_running_per_key < 0:
        fail(f"--max-running-per-key must be 0 or more, not {max_running_per_key}", 2)
    made = call(
        address,
        namespace,
        lambda c: c.set_queue(
            queue,
            max_running_per_key=max_running_per_key,
            max_starts_per_key=max_starts_per_key,
        ),
    )
    out.print(settings_table([made]))


@queue_app.command("pause")
def queue_pause(
    queue: QueueArg,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Pause a queue cluster-wide: its due tasks still fire, no worker gets them."""
    out.print(settings_table([call(address, namespace, lambda c: c.pause_queue(queue))]))


@queue_app.command("resume")
def queue_resume(
    queue: QueueArg,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Resume a paused queue (the misfire policy applies to what waited meanwhile).

    READY tasks whose misfire policy is SKIP and that waited past their grace are skipped.
    """
    resumed = call(address, namespace, lambda c: c.resume_queue(queue))
    out.print(settings_table([resumed.settings]))
    out.print(f"resumed {escape(queue)}: {resumed.skipped} tasks skipped by their misfire policy")


@queue_app.command("show")
def queue_show(
    queue: QueueArg,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Show a queue's settings."""
    out.print(settings_table([call(address, namespace, lambda c: c.queue_settings(queue))]))


@queue_app.command("list")
def queue_list(
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """List the namespace's queues with settings (paused, or limited per key)."""
    out.print(settings_table(call(address, namespace, lambda c: c.list_queue_settings())))
