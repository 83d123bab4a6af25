"""Task commands: submit, get, list, and the dead-letter queue (``dlq``); cancel, requeue
and run-now are ``chronoq.cli.bulk``."""

from __future__ import annotations

import dataclasses
import enum
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from chronoq.cli.common import (
    DEFAULT_ADDRESS,
    AddressOpt,
    JsonOpt,
    NamespaceOpt,
    call,
    duration_opt,
    env,
    err,
    given,
    instant,
    make_client,
    out,
    progress,
    run,
)
from chronoq.cli.labels import parse_labels
from chronoq.cli.render import print_json, state, task_table, tasks_table
from chronoq.client import Client, NewTask, Submitted
from chronoq.client.pacing import pacer
from chronoq.limits import MAX_PRIORITY, MIN_PRIORITY
from chronoq.models import DEFAULT_NAMESPACE, MisfirePolicy, Task, TaskState

SUBMIT_BATCH = 1000
"""Tasks per SubmitBatch call of ``submit --count``."""
PAGE_SIZE = 1000
"""Tasks per List call."""

dlq_app = typer.Typer(
    help="The dead-letter queue: list and requeue DEAD tasks.", no_args_is_help=True
)


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


def register(app: typer.Typer) -> None:
    """Add the task commands to ``app``."""
    app.command()(submit)
    app.command()(get)
    app.command("list")(list_tasks)
    app.add_typer(dlq_app, name="dlq")


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


def submit(
    queue: Annotated[str, typer.Argument(help="Queue the task goes to.")],
    at: Annotated[
        datetime | None,
        typer.Option(
            "--at",
            parser=instant,
            metavar="ISO8601",
            envvar=env("SUBMIT_AT"),
            help="When to run, with a zone: 2030-01-01T12:00:00Z.",
        ),
    ] = None,
    in_: Annotated[
        timedelta | None,
        duration_opt(
            "--in",
            envvar=env("SUBMIT_IN"),
            help="Run after this delay: 250ms, 30s, 5m, 1h, 2d. Default: now.",
        ),
    ] = None,
    payload: Annotated[
        str | None, typer.Option(envvar=env("SUBMIT_PAYLOAD"), help="Payload text.")
    ] = None,
    payload_file: Annotated[
        Path | None,
        typer.Option(
            envvar=env("SUBMIT_PAYLOAD_FILE"),
            dir_okay=False,
            help="Read the payload from a file ('-': stdin).",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            envvar=env("SUBMIT_KEY"),
            help="Idempotency key: a second submit returns the first task.",
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(envvar=env("SUBMIT_MAX_ATTEMPTS"), min=1, help="Attempts before DEAD."),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            envvar=env("SUBMIT_PRIORITY"),
            min=MIN_PRIORITY,
            max=MAX_PRIORITY,
            help="Higher is claimed first.",
        ),
    ] = None,
    lease_timeout: Annotated[
        timedelta | None,
        duration_opt(
            envvar=env("SUBMIT_LEASE_TIMEOUT"), help="A worker's lease per attempt, e.g. 30s."
        ),
    ] = None,
    misfire: Annotated[
        Misfire | None,
        typer.Option(envvar=env("SUBMIT_MISFIRE"), help="What to do when fired late."),
    ] = None,
    misfire_grace: Annotated[
        timedelta | None,
        duration_opt(
            envvar=env("SUBMIT_MISFIRE_GRACE"), help="How late 'skip' still fires, e.g. 60s."
        ),
    ] = None,
    concurrency_key: Annotated[
        str | None,
        typer.Option(
            envvar=env("SUBMIT_CONCURRENCY_KEY"),
            help="Concurrency key: the queue's per-key limits count tasks by it.",
        ),
    ] = None,
    unique_key: Annotated[
        str | None,
        typer.Option(
            envvar=env("SUBMIT_UNIQUE_KEY"),
            help="Unique key: no second pending task with it (see --unique-for).",
        ),
    ] = None,
    unique_for: Annotated[
        timedelta | None,
        duration_opt(
            "--unique-for",
            envvar=env("SUBMIT_UNIQUE_FOR"),
            help="Keep the unique key for this long after run_at, e.g. 1h. Default: while "
            "pending.",
        ),
    ] = None,
    debounce_key: Annotated[
        str | None,
        typer.Option(
            envvar=env("SUBMIT_DEBOUNCE_KEY"),
            help="Debounce key: a submit with it postpones its pending task (with --debounce).",
        ),
    ] = None,
    debounce: Annotated[
        timedelta | None,
        duration_opt(
            "--debounce",
            envvar=env("SUBMIT_DEBOUNCE"),
            help="Run this long after the last submit of the debounce key, e.g. 5s.",
        ),
    ] = None,
    debounce_max: Annotated[
        timedelta | None,
        duration_opt(
            "--debounce-max",
            envvar=env("SUBMIT_DEBOUNCE_MAX"),
            help="Postpone at most this long after the first submit. Default: 10 x --debounce.",
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            metavar="KEY=VALUE",
            envvar=env("SUBMIT_LABEL"),
            help="A label of the task (repeatable).",
        ),
    ] = None,
    count: Annotated[
        int,
        typer.Option(
            envvar=env("SUBMIT_COUNT"),
            min=1,
            help=f"Submit this many copies (in batches of {SUBMIT_BATCH}).",
        ),
    ] = 1,
    rate: Annotated[
        float | None,
        typer.Option(
            envvar=env("SUBMIT_RATE"),
            min=0.001,
            help="With --count: submit at most this many tasks per second (default: at once).",
        ),
    ] = None,
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
        lease_timeout=lease_timeout,
        misfire_grace=misfire_grace,
        concurrency_key=concurrency_key,
        unique_key=unique_key,
        unique_for=unique_for,
        debounce_key=debounce_key,
        debounce=debounce,
        debounce_max=debounce_max,
        labels=parse_labels(label) or None,
        **given(priority=priority, misfire_policy=misfire.policy if misfire else None),
    )
    for result in run(_submit(address, namespace, template, key, count, rate)):
        typer.echo(result.task.id)
        if not result.created:
            err.print(
                f"[yellow]{result.task.id}: already submitted with key "
                f"{escape(result.task.idempotency_key or '')!s}; not created again[/]"
            )


async def _submit(
    address: str,
    namespace: str,
    template: NewTask,
    key: str | None,
    count: int,
    rate: float | None = None,
) -> list[Submitted]:
    def one(i: int) -> NewTask:
        k = key if count == 1 or key is None else f"{key}-{i}"
        return dataclasses.replace(template, idempotency_key=k)

    # Paced: batches of about a second's worth (at most SUBMIT_BATCH), each waiting its turn.
    size = SUBMIT_BATCH if rate is None else max(1, min(SUBMIT_BATCH, int(rate)))
    paced = None if rate is None else pacer(rate, per=size)
    results: list[Submitted] = []
    async with make_client(address, namespace) as client:
        with progress(count > size) as bar:
            task = bar.add_task("submitting", total=count)
            for start in range(0, count, size):
                batch = [one(i) for i in range(start, min(count, start + size))]
                if paced is not None:
                    await paced.wait()
                results += await client.submit_many(batch)
                bar.advance(task, len(batch))
    return results


# ---------------------------------------------------------------------- get, cancel, list


def get(
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.")],
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Show one task.

    Example: chronoq get 0b6f6a1e-8d4c-4c3a-9a57-3c1f0e7b1d2a --json
    """
    task = call(address, namespace, lambda c: c.get(task_id))
    if as_json:
        print_json(task)
    else:
        out.print(task_table(task))


async def _collect(
    client: Client,
    *,
    queue: str | None,
    state: TaskState | None,
    dead: bool,
    limit: int,
    labels: dict[str, str] | None = None,
    run_at_from: datetime | None = None,
    run_at_to: datetime | None = None,
) -> list[Task]:
    tasks: list[Task] = []
    token = ""
    while len(tasks) < limit:
        page = await client.list(
            queue=queue,
            state=state,
            dead=dead,
            page_token=token,
            page_size=min(PAGE_SIZE, limit - len(tasks)),
            labels=labels,
            run_at_from=run_at_from,
            run_at_to=run_at_to,
        )
        tasks += page.tasks
        token = page.next_token
        if not token:
            break
    return tasks


def list_tasks(
    queue: Annotated[
        str | None,
        typer.Option("--queue", "-q", envvar=env("LIST_QUEUE"), help="Only this queue."),
    ] = None,
    state: Annotated[
        StateName | None,
        typer.Option("--state", envvar=env("LIST_STATE"), help="Only this state."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", envvar=env("LIST_LIMIT"), min=1, help="At most this many.")
    ] = 50,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            envvar=env("LIST_LABEL"),
            metavar="KEY=VALUE",
            help="Only tasks carrying this label (repeatable: all must match).",
        ),
    ] = None,
    run_at_from: Annotated[
        datetime | None,
        typer.Option(
            "--run-at-from",
            envvar=env("LIST_RUN_AT_FROM"),
            parser=instant,
            metavar="TIME",
            help="Only tasks due at or after this ISO 8601 time.",
        ),
    ] = None,
    run_at_to: Annotated[
        datetime | None,
        typer.Option(
            "--run-at-to",
            envvar=env("LIST_RUN_AT_TO"),
            parser=instant,
            metavar="TIME",
            help="Only tasks due before this ISO 8601 time.",
        ),
    ] = None,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """List tasks, ordered by id.

    Example: chronoq list --queue emails --state scheduled --label customer=42 --limit 20
    """
    only = state.state if state else None
    labels = parse_labels(label) or None
    tasks = call(
        address,
        namespace,
        lambda c: _collect(
            c,
            queue=queue,
            state=only,
            dead=False,
            limit=limit,
            labels=labels,
            run_at_from=run_at_from,
            run_at_to=run_at_to,
        ),
    )
    if as_json:
        print_json(tasks)
    else:
        out.print(tasks_table(tasks, title=f"{len(tasks)} task(s)"))


# ---------------------------------------------------------------------- dlq


@dlq_app.command("list")
def dlq_list(
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", envvar=env("DLQ_QUEUE"), help="Only this queue.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", envvar=env("DLQ_LIMIT"), min=1, help="At most this many.")
    ] = 50,
    as_json: JsonOpt = False,
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """List DEAD tasks with their last error.

    Example: chronoq dlq list --queue emails
    """
    tasks = call(
        address, namespace, lambda c: _collect(c, queue=queue, state=None, dead=True, limit=limit)
    )
    if as_json:
        print_json(tasks)
    else:
        out.print(tasks_table(tasks, title=f"{len(tasks)} dead task(s)", errors=True))


@dlq_app.command("requeue")
def dlq_requeue(
    task_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Dead task ids.")],
    address: AddressOpt = DEFAULT_ADDRESS,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Requeue DEAD tasks to run now with a fresh attempt budget (all or none).

    Example: chronoq dlq requeue 0b6f6a1e-8d4c-4c3a-9a57-3c1f0e7b1d2a
    """
    for task in call(address, namespace, lambda c: c.requeue(task_ids)):
        out.print(f"{task.id} {state(task.state)}")
