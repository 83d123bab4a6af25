"""Bulk commands by filter: ``cancel``, ``requeue`` and ``run-now`` many tasks at once.

``chronoq cancel ID`` cancels one task as before; with ``--queue``, ``--label k=v``,
``--state`` or a run_at range instead of an id it cancels every matching task, in batches on
the node, and says how many (``--dry-run``: how many would be, none changed).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated

import typer

from chronoq.cli.common import (
    DEFAULT_ADDRESS,
    AddressOpt,
    JsonOpt,
    NamespaceOpt,
    call,
    env,
    fail,
    instant,
    out,
)
from chronoq.cli.labels import parse_labels
from chronoq.cli.render import print_json, state
from chronoq.client import Client
from chronoq.models import DEFAULT_NAMESPACE, TaskState
from chronoq.taskfilter import BulkOutcome


class CancelState(enum.StrEnum):
    """The states a cancel changes."""

    scheduled = "scheduled"
    ready = "ready"
    running = "running"
    dead = "dead"

    @property
    def state(self) -> TaskState:
        return TaskState[self.value.upper()]


def register(app: typer.Typer) -> None:
    """Add the bulk commands to ``app``."""
    app.command()(cancel)
    app.command()(requeue)
    app.command("run-now")(run_now)


def _queue_opt(name: str) -> object:
    return typer.Option("--queue", "-q", envvar=env(f"{name}_QUEUE"), help="Only this queue.")


def _label_opt(name: str) -> object:
    return typer.Option(
        "--label",
        envvar=env(f"{name}_LABEL"),
        metavar="KEY=VALUE",
        help="Only tasks carrying this label (repeatable: all must match).",
    )


def _from_opt(name: str) -> object:
    return typer.Option(
        "--run-at-from",
        envvar=env(f"{name}_RUN_AT_FROM"),
        parser=instant,
        metavar="TIME",
        help="Only tasks due at or after this ISO 8601 time.",
    )


def _to_opt(name: str) -> object:
    return typer.Option(
        "--run-at-to",
        envvar=env(f"{name}_RUN_AT_TO"),
        parser=instant,
        metavar="TIME",
        help="Only tasks due before this ISO 8601 time.",
    )


def _dry_opt(name: str) -> object:
    return typer.Option(
        "--dry-run", envvar=env(f"{name}_DRY_RUN"), help="Count the tasks; change none."
    )


def _report(outcome: BulkOutcome, verb: str, as_json: bool) -> None:
    if as_json:
        print_json({"count": outcome.count, "dry_run": outcome.dry_run, "more": outcome.more})
    elif outcome.dry_run:
        out.print(f"{outcome.count} task(s) match; nothing was {verb} (dry run)")
    else:
        out.print(f"{outcome.count} task(s) {verb}")


def cancel(
    task_id: Annotated[
        str | None, typer.Argument(metavar="[ID]", help="One task's id (else: a filter).")
    ] = None,
    queue: Annotated[str | None, _queue_opt("CANCEL")] = None,
    label: Annotated[list[str] | None, _label_opt("CANCEL")] = None,
    only: Annotated[
        CancelState | None,
        typer.Option("--state", envvar=env("CANCEL_STATE"), help="Only tasks in this state."),
    ] = None,
    run_at_from: Annotated[datetime | None, _from_opt("CANCEL")] = None,
    run_at_to: Annotated[datetime | None, _to_opt("CANCEL")] = None,
    dry_run: Annotated[bool, _dry_opt("CANCEL")] = False,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Cancel a task that has not finished (a running worker learns it by heartbeat), or
    every task a filter matches (SCHEDULED, READY, RUNNING or DEAD).

    Examples: chronoq cancel 0b6f6a1e-8d4c-4c3a-9a57-3c1f0e7b1d2a;
    chronoq cancel --queue emails --label customer=42 --dry-run
    """
    labels = parse_labels(label)
    filtered = queue or labels or only or run_at_from or run_at_to
    if task_id is not None:
        if filtered or dry_run:
            fail("give a task id or a filter (--queue, --label, --state, --run-at-*), not both", 2)
        task = call(address, namespace, lambda c: c.cancel(task_id))
        if as_json:
            print_json(task)
        else:
            out.print(f"{task.id} {state(task.state)}")
        return
    if not filtered:
        fail("give a task id, or a filter: --queue, --label, --state or --run-at-*", 2)

    async def go(c: Client) -> BulkOutcome:
        return await c.cancel_where(
            queue=queue,
            labels=labels,
            state=only.state if only else None,
            run_at_from=run_at_from,
            run_at_to=run_at_to,
            dry_run=dry_run,
        )

    _report(call(address, namespace, go), "cancelled", as_json)


def requeue(
    queue: Annotated[str | None, _queue_opt("REQUEUE")] = None,
    label: Annotated[list[str] | None, _label_opt("REQUEUE")] = None,
    run_at_from: Annotated[datetime | None, _from_opt("REQUEUE")] = None,
    run_at_to: Annotated[datetime | None, _to_opt("REQUEUE")] = None,
    dry_run: Annotated[bool, _dry_opt("REQUEUE")] = False,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Requeue the DEAD tasks a filter matches: READY now, with a fresh attempt budget
    (by id: chronoq dlq requeue ID...).

    Example: chronoq requeue --queue emails --label customer=42
    """
    labels = parse_labels(label)
    outcome = call(
        address,
        namespace,
        lambda c: c.requeue_where(
            queue=queue,
            labels=labels,
            run_at_from=run_at_from,
            run_at_to=run_at_to,
            dry_run=dry_run,
        ),
    )
    _report(outcome, "requeued", as_json)


def run_now(
    queue: Annotated[str | None, _queue_opt("RUN_NOW")] = None,
    label: Annotated[list[str] | None, _label_opt("RUN_NOW")] = None,
    run_at_from: Annotated[datetime | None, _from_opt("RUN_NOW")] = None,
    run_at_to: Annotated[datetime | None, _to_opt("RUN_NOW")] = None,
    dry_run: Annotated[bool, _dry_opt("RUN_NOW")] = False,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Run the SCHEDULED tasks a filter matches now: READY at once (a paused queue holds
    them until it resumes).

    Example: chronoq run-now --queue reports --label tenant=acme --dry-run
    """
    labels = parse_labels(label)
    if not (queue or labels or run_at_from or run_at_to):
        fail("give a filter: --queue, --label or --run-at-* (not every scheduled task)", 2)
    outcome = call(
        address,
        namespace,
        lambda c: c.run_now_where(
            queue=queue,
            labels=labels,
            run_at_from=run_at_from,
            run_at_to=run_at_to,
            dry_run=dry_run,
        ),
    )
    _report(outcome, "made ready", as_json)
