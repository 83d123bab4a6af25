"""Task definitions: a decorator registers a handler with its queue and defaults, and gives it
submit helpers, so the defaults are written once instead of at every submit.

```python
tasks = TaskRegistry()

@tasks.task(queue="emails", max_attempts=5, lease_timeout=timedelta(minutes=2))
def send_email(ctx: TaskContext) -> None:
    mail(ctx.data["to"])

tasks.bind(SyncClient("127.0.0.1:7070"))            # or an async Client
send_email.schedule_in(timedelta(minutes=5), payload={"to": "a@example.com"})
await send_email.aschedule(at=when, payload={...}, max_attempts=1)   # a default overridden
```

A worker serves every registered task: ``tasks.worker(client).run()`` (async) or
``tasks.run_worker("127.0.0.1:7070")`` (blocking). The plain ``{queue: handler}`` dict of
``Worker`` keeps working, and ``tasks.handlers()`` is such a dict.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, overload

from chronoq import errors
from chronoq.client import controls
from chronoq.client.client import Client
from chronoq.client.context import Handler
from chronoq.client.controls import KeyOption, LabelsOption
from chronoq.client.payload import Payload
from chronoq.client.sync import SyncClient
from chronoq.client.values import NewTask, Submitted
from chronoq.client.worker import Worker, WorkerStats
from chronoq.limits import check_name
from chronoq.models import MisfirePolicy

#: Seconds between checks of a ``run_worker`` stop event.
STOP_POLL = 0.1
#: Tasks one registry holds at most (a registry is written by hand, not generated).
MAX_TASKS = 1000

#: The ``NewTask`` fields a submit may override; the others are set by the helpers.
_OVERRIDABLE = frozenset(
    {
        "idempotency_key",
        "max_attempts",
        "backoff_initial",
        "backoff_max",
        "lease_timeout",
        "priority",
        "misfire_policy",
        "misfire_grace",
        "content_type",
        *controls.FIELDS,
    }
)


@dataclass(frozen=True, kw_only=True)
class TaskOptions:
    """A definition's defaults for its submits; None leaves a field to the node's defaults
    (``TaskDefaults``)."""

    max_attempts: int | None = None
    backoff_initial: timedelta | None = None
    backoff_max: timedelta | None = None
    lease_timeout: timedelta | None = None
    priority: int | None = None
    misfire_policy: MisfirePolicy | None = None
    misfire_grace: timedelta | None = None
    # Queue controls: each key and the labels a value, or a function of the payload that
    # gives it at each submit (``concurrency_key=lambda data: data["customer"]``).
    concurrency_key: KeyOption = None
    unique_key: KeyOption = None
    unique_for: timedelta | None = None
    debounce_key: KeyOption = None
    debounce: timedelta | None = None
    debounce_max: timedelta | None = None
    labels: LabelsOption = None

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise errors.ConfigError(f"max_attempts: must be >= 1, got {self.max_attempts}")
        for name in (
            "backoff_initial",
            "backoff_max",
            "lease_timeout",
            "misfire_grace",
            *controls.WINDOW_FIELDS,
        ):
            value = getattr(self, name)
            if value is not None and value < timedelta(0):
                raise errors.ConfigError(f"{name}: must not be negative, got {value}")
        if (
            self.backoff_initial is not None
            and self.backoff_max is not None
            and self.backoff_max < self.backoff_initial
        ):
            raise errors.ConfigError("need backoff_initial <= backoff_max")

    def fields(self) -> dict[str, Any]:
        """The set defaults, as ``NewTask`` fields."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


class TaskDefinition:
    """A registered handler with its queue and defaults; calling it calls the handler."""

    def __init__(self, registry: TaskRegistry, queue: str, handler: Handler, options: TaskOptions):
        self.registry = registry
        self.queue = queue
        self.handler = handler
        self.options = options
        self.__name__ = getattr(handler, "__name__", queue)
        self.__doc__ = getattr(handler, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.handler(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<task {self.__name__} on queue {self.queue!r}>"

    def new(
        self,
        *,
        at: datetime | None = None,
        delay: timedelta | None = None,
        payload: Payload = b"",
        **overrides: Any,
    ) -> NewTask:
        """A ``NewTask`` of this definition (for ``submit_many``): its defaults, then
        ``overrides``. Neither ``at`` nor ``delay``: due now."""
        unknown = sorted(set(overrides) - _OVERRIDABLE)
        if unknown:
            raise errors.ConfigError(
                f"{self.__name__}: unknown task fields {', '.join(unknown)} "
                f"(known: {', '.join(sorted(_OVERRIDABLE))})"
            )
        fields = self.options.fields()
        fields.update(overrides)
        fields = controls.resolved(fields, payload)
        return NewTask(queue=self.queue, run_at=at, delay=delay, payload=payload, **fields)

    # ------------------------------------------------------------------ blocking

    def schedule(
        self,
        *,
        at: datetime | None = None,
        payload: Payload = b"",
        client: SyncClient | None = None,
        **overrides: Any,
    ) -> Submitted:
        """Submit to run at ``at`` (None: now) through a ``SyncClient`` (the bound one by
        default); ``overrides`` replace this definition's defaults for this task."""
        task = self.new(at=at, payload=payload, **overrides)
        return self.registry.sync_client(client).submit(task.queue, **_submit_fields(task))

    def schedule_in(
        self,
        delay: timedelta,
        *,
        payload: Payload = b"",
        client: SyncClient | None = None,
        **overrides: Any,
    ) -> Submitted:
        """Submit to run ``delay`` from now (the node's clock)."""
        task = self.new(delay=delay, payload=payload, **overrides)
        return self.registry.sync_client(client).submit(task.queue, **_submit_fields(task))

    # ------------------------------------------------------------------ async

    async def aschedule(
        self,
        *,
        at: datetime | None = None,
        payload: Payload = b"",
        client: Client | SyncClient | None = None,
        **overrides: Any,
    ) -> Submitted:
        """``schedule`` for async code: through an async ``Client``, or a ``SyncClient``
        without blocking the caller's loop."""
        return await self.registry.asubmit(self.new(at=at, payload=payload, **overrides), client)

    async def aschedule_in(
        self,
        delay: timedelta,
        *,
        payload: Payload = b"",
        client: Client | SyncClient | None = None,
        **overrides: Any,
    ) -> Submitted:
        """``schedule_in`` for async code."""
        task = self.new(delay=delay, payload=payload, **overrides)
        return await self.registry.asubmit(task, client)


def _submit_fields(task: NewTask) -> dict[str, Any]:
    """``task``'s fields but its queue, as ``submit`` takes them (no copy of the payload)."""
    return {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.name != "queue"}


class TaskRegistry:
    """The task definitions of an application, and the client their helpers submit through."""

    def __init__(self, client: Client | SyncClient | None = None) -> None:
        self._tasks: dict[str, TaskDefinition] = {}
        self._client: Client | SyncClient | None = client

    def bind(self, client: Client | SyncClient | None) -> None:
        """The client the submit helpers use when given none (None unbinds)."""
        self._client = client

    @overload
    def task(self, handler: Handler, /) -> TaskDefinition: ...

    @overload
    def task(
        self,
        handler: None = None,
        /,
        *,
        queue: str | None = None,
        max_attempts: int | None = None,
        backoff_initial: timedelta | None = None,
        backoff_max: timedelta | None = None,
        lease_timeout: timedelta | None = None,
        priority: int | None = None,
        misfire_policy: MisfirePolicy | None = None,
        misfire_grace: timedelta | None = None,
        concurrency_key: KeyOption = None,
        unique_key: KeyOption = None,
        unique_for: timedelta | None = None,
        debounce_key: KeyOption = None,
        debounce: timedelta | None = None,
        debounce_max: timedelta | None = None,
        labels: LabelsOption = None,
    ) -> Callable[[Handler], TaskDefinition]: ...

    def task(
        self,
        handler: Handler | None = None,
        /,
        *,
        queue: str | None = None,
        **defaults: Any,
    ) -> TaskDefinition | Callable[[Handler], TaskDefinition]:
        """Register a handler: ``@tasks.task`` (queue named after the function) or
        ``@tasks.task(queue="emails", max_attempts=5, ...)`` with its defaults; a key or the
        labels may be a function of the payload (``concurrency_key=lambda d: d["customer"]``)."""
        options = TaskOptions(**defaults)

        def register(fn: Handler) -> TaskDefinition:
            name: str = queue or str(getattr(fn, "__name__", ""))
            try:
                check_name("queue", name)
            except errors.InvalidArgument as exc:
                raise errors.ConfigError(f"{fn!r}: {exc}") from None
            if name in self._tasks:
                raise errors.ConfigError(
                    f"queue {name!r} has a task already: {self._tasks[name].__name__}"
                )
            if len(self._tasks) >= MAX_TASKS:
                raise errors.ConfigError(f"a registry holds at most {MAX_TASKS} tasks")
            definition = TaskDefinition(self, name, fn, options)
            self._tasks[name] = definition
            return definition

        return register(handler) if handler is not None else register

    def __getitem__(self, queue: str) -> TaskDefinition:
        return self._tasks[queue]

    def __contains__(self, queue: object) -> bool:
        return queue in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def queues(self) -> list[str]:
        return list(self._tasks)

    def handlers(self, queues: Sequence[str] = ()) -> dict[str, Handler]:
        """``{queue: handler}`` of ``queues`` (default: every task), as ``Worker`` takes."""
        missing = [q for q in queues if q not in self._tasks]
        if missing:
            raise errors.ConfigError(f"no task registered for queue {', '.join(missing)}")
        return {q: self._tasks[q].handler for q in (queues or self._tasks)}

    # ------------------------------------------------------------------ clients

    def sync_client(self, client: SyncClient | None = None) -> SyncClient:
        chosen = client or self._client
        if isinstance(chosen, SyncClient):
            return chosen
        if chosen is None:
            raise errors.ConfigError(
                "no client: pass client=..., or tasks.bind(SyncClient(target)) first"
            )
        raise errors.ConfigError(
            "schedule() blocks and needs a SyncClient; with an async Client, "
            "await aschedule() instead"
        )

    async def asubmit(self, task: NewTask, client: Client | SyncClient | None = None) -> Submitted:
        """Submit ``task`` from async code through ``client`` (default: the bound one)."""
        chosen = client or self._client
        if chosen is None:
            raise errors.ConfigError("no client: pass client=..., or tasks.bind(client) first")
        fields = _submit_fields(task)
        if isinstance(chosen, SyncClient):
            return await chosen.asubmit(task.queue, **fields)
        return await chosen.submit(task.queue, **fields)

    # ------------------------------------------------------------------ workers

    def worker(self, client: Client, *, queues: Sequence[str] = (), **options: Any) -> Worker:
        """A ``Worker`` of the registered tasks (or of ``queues``); ``options`` go to it
        (``concurrency``, ``rates``, ...)."""
        if not self._tasks:
            raise errors.ConfigError("no task registered: decorate a handler with @tasks.task")
        return Worker(client, self.handlers(queues), **options)

    def run_worker(
        self,
        target: str,
        *,
        queues: Sequence[str] = (),
        stop: threading.Event | None = None,
        client_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> WorkerStats:
        """Run a worker of the registered tasks against ``target`` until SIGINT/SIGTERM (in
        the main thread) or until ``stop`` is set; blocks, and returns its counts."""
        return asyncio.run(self._serve(target, queues, stop, dict(client_options or {}), options))

    async def _serve(
        self,
        target: str,
        queues: Sequence[str],
        stop: threading.Event | None,
        client_options: dict[str, Any],
        options: dict[str, Any],
    ) -> WorkerStats:
        async with Client(target, **client_options) as client:
            worker = self.worker(client, queues=queues, **options)
            if threading.current_thread() is threading.main_thread():
                worker.install_signal_handlers()
            watcher = asyncio.create_task(_stop_when_set(stop, worker)) if stop else None
            try:
                return await worker.run()
            finally:
                if watcher is not None:
                    watcher.cancel()


async def _stop_when_set(event: threading.Event, worker: Worker) -> None:
    # A threading.Event cannot wake a loop: wait on it in short slices, off the loop.
    while not await asyncio.to_thread(event.wait, STOP_POLL):
        pass
    worker.stop()
