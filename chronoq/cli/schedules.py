"""Schedule commands: ``chronoq schedule create|list|pause|resume|delete``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chronoq.cli.common import (
    DEFAULT_ADDRESS,
    AddressOpt,
    NamespaceOpt,
    call,
    duration,
    env,
    fail,
    instant,
    out,
)
from chronoq.cli.render import utc
from chronoq.durations import format_duration
from chronoq.models import DEFAULT_NAMESPACE, Schedule
from chronoq.recurrence import CatchUp, Cron

schedule_app = typer.Typer(
    help="Recurring schedules: cron expressions or fixed intervals.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    """Add ``chronoq schedule`` to ``app``."""
    app.add_typer(schedule_app, name="schedule")


def schedules_table(schedules: Sequence[Schedule]) -> Table:
    """One line per schedule: its rule, state, next occurrence and counts."""
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
            utc(s.next_fire_at),
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
            "--queue", "-q", envvar=env("SCHEDULE_QUEUE"), help="Queue of the tasks it creates."
        ),
    ],
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            envvar=env("SCHEDULE_CRON"),
            help="5-field cron expression, e.g. '*/5 * * * *'.",
        ),
    ] = None,
    every: Annotated[
        str | None,
        typer.Option(
            "--every", envvar=env("SCHEDULE_EVERY"), help="Fixed interval, e.g. 30s, 5m, 1h."
        ),
    ] = None,
    tz: Annotated[
        str,
        typer.Option(
            "--tz", envvar=env("SCHEDULE_TZ"), help="IANA time zone of the cron expression."
        ),
    ] = "UTC",
    catch_up: Annotated[
        str,
        typer.Option(
            "--catch-up",
            envvar=env("SCHEDULE_CATCH_UP"),
            help="After downtime: all, latest or none.",
        ),
    ] = "latest",
    payload: Annotated[str, typer.Option("--payload", envvar=env("SCHEDULE_PAYLOAD"))] = "",
    start_at: Annotated[
        str | None,
        typer.Option(
            "--start-at",
            envvar=env("SCHEDULE_START_AT"),
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
        fail("give exactly one of --cron and --every", 2)
    policies = {"all": CatchUp.ALL, "latest": CatchUp.LATEST, "none": CatchUp.NONE}
    if catch_up not in policies:
        fail(f"--catch-up must be all, latest or none, not {catch_up!r}", 2)
    interval = duration(every) if every is not None else None
    start = instant(start_at) if start_at is not None else None
    made = call(
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
    out.print(schedules_table([made]))


@schedule_app.command("list")
def schedule_list(
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """List the schedules of a namespace."""
    out.print(schedules_table(call(address, namespace, lambda c: c.list_schedules())))


@schedule_app.command("pause")
def schedule_pause(
    name: Annotated[str, typer.Argument()],
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Pause a schedule: no occurrence is created until it is resumed."""
    out.print(schedules_table([call(address, namespace, lambda c: c.pause_schedule(name))]))


@schedule_app.command("resume")
def schedule_resume(
    name: Annotated[str, typer.Argument()],
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Resume a paused schedule from its next occurrence (paused time is not caught up)."""
    out.print(schedules_table([call(address, namespace, lambda c: c.resume_schedule(name))]))


@schedule_app.command("delete")
def schedule_delete(
    name: Annotated[str, typer.Argument()],
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Delete a schedule (tasks it already created stay)."""
    call(address, namespace, lambda c: c.delete_schedule(name))
    out.print(f"deleted {escape(name)}")
