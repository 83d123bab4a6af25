"""An in-memory stand-in for ``Client`` and ``SyncClient`` for an application's own tests.

```python
from chronoq.testing import InMemorySyncClient

def test_signup_schedules_the_welcome_email():
    client = InMemorySyncClient(handlers=tasks)      # a TaskRegistry or {queue: handler}
    tasks.bind(client)
    post("/signup", {"email": "ada@example.com"})
    assert client.payloads(queue="welcome-emails") == [{"email": "ada@example.com"}]
    client.run_all()                                  # or eager=True, or run_due(now)
```

No node, store or network: a submit builds its spec with the SDK's own code
(``NewTask.to_pb``, the client's idempotency keys) and checks it with the node's own
(``spec_from_pb`` then ``Limits.check``), so a field that a live node refuses is refused here
with the same error (``BadRequest``, the node's message). The stand-ins are subclasses of
the real clients (``isinstance`` checks, type hints and ``TaskRegistry.bind`` accept them);
a call they do not model raises
``InMemoryUnsupported`` naming it instead of pretending.

What is modelled: idempotency keys, unique keys (while pending, and ``unique_for``), debounce,
the task defaults, attempts and retries with the node's backoff (``chronoq.retry``),
``FatalTaskError``, cancel. What is not: claims and leases (handlers run in the caller),
queue pauses and limits, schedules, cluster calls. Eager mode and ``run_all`` ignore
``run_at``; ``run_due(now)`` honours it.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import functools
import inspect
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from chronoq import errors, retry
from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2
from chronoq.client.client import Client
from chronoq.client.context import FatalTaskError, Handler, TaskContext
from chronoq.client.payload import decode as decode_payload
from chronoq.client.registry import TaskRegistry
from chronoq.client.sync import SyncClient
from chronoq.client.values import NewTask, Submitted
from chronoq.limits import Limits, default_debounce_max
from chronoq.models import DEFAULT_NAMESPACE, TASK_DEFAULTS, Task, TaskDefaults, TaskSpec, TaskState

#: Handler runs one ``run_all``/``run_due``/eager submit may make at most: a handler that
#: submits a task on every run would otherwise never let the call return.
MAX_RUNS = 10_000
#: The worker id a handler's context carries.
WORKER_ID = "in-memory"
#: Tasks one stand-in keeps at most (a test's tasks, not a load).
MAX_TASKS = 100_000

_PENDING = (TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING)
Handlers = TaskRegistry | Mapping[str, Handler] | None
Clock = Callable[[], datetime]


class InMemoryUnsupported(errors.ConfigError):
    """The in-memory client does not model this call; test it against a real node
    (``chronoq.local`` starts one)."""


@dataclass(frozen=True)
class Run:
    """One handler run: the task as it ended the attempt, and the error it raised (None: ok)."""

    task: Task
    error: BaseException | None = None


def as_remote(exc: errors.ChronoqError) -> errors.RemoteError:
    """``exc`` as a client gets it from a node: the error of its status code, with the
    message the node sends (``chronoq.node.edge.status``)."""
    code = type(exc).grpc_code
    return errors.remote_error_class(code)(f"{code}: {exc.message}", code)


def _system_now() -> datetime:
    return datetime.now(UTC)


class TaskLedger:
    """The stand-ins' state: every accepted task by id, in submit order. No I/O; shared by an
    ``InMemoryClient`` and the ``InMemorySyncClient`` around it."""

    def __init__(
        self,
        *,
        clock: Clock = _system_now,
        defaults: TaskDefaults = TASK_DEFAULTS,
        limits: Limits | None = None,
    ) -> None:
        self.clock = clock
        self.defaults = defaults
        self.limits = limits or Limits()
        self.runs: list[Run] = []
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()  # a SyncClient is shared by request threads

    # ------------------------------------------------------------------ submit

    def accept(self, specs: Sequence[tuple[tasks_pb2.TaskSpec, bool]]) -> list[Submitted]:
        """The node's answer to a batch of wire specs: each checked as a node checks it, then
        created, or answered with the task its idempotency, unique or debounce key names."""
        now = self.clock()
        try:
            checked = [
                (
                    self.limits.check(
                        convert.spec_from_pb(pb, now, self.defaults, self.limits), now
                    ),
                    o,
                )
                for pb, o in specs
            ]
        except errors.ChronoqError as exc:
            raise as_remote(exc) from None
        with self._lock:
            if len(self._tasks) + len(checked) > MAX_TASKS:
                raise errors.BadRequest(f"the in-memory client holds at most {MAX_TASKS} tasks")
            out = []
            for spec, ours in checked:
                task, created = self._admit(spec, now)
                # As the client reports it: a key of its own makes the task its own.
                keyed = spec.unique_key or spec.debounce_key
                out.append(Submitted(task, created or (ours and not keyed)))
            return out

    def _check(self, pb: tasks_pb2.TaskSpec, now: datetime) -> TaskSpec:
        """The node's definition of an acceptable spec (``chronoq.api.spec_batch``)."""
        return self.limits.check(convert.spec_from_pb(pb, now, self.defaults, self.limits), now)

    def _admit(self, spec: TaskSpec, now: datetime) -> tuple[Task, bool]:
        for task in self._tasks.values():
            if task.namespace != spec.namespace:
                continue
            if spec.idempotency_key and task.idempotency_key == spec.idempotency_key:
                return task, False
        if spec.unique_key:
            holder = self._unique_holder(spec, now)
            if holder is not None:
                return holder, False
        if spec.debounce_key and spec.debounce is not None:
            return self._debounced(spec, now)
        return self._create(spec, spec.run_at), True

    def _unique_holder(self, spec: TaskSpec, now: datetime) -> Task | None:
        for task in self._tasks.values():
            if task.namespace != spec.namespace or task.unique_key != spec.unique_key:
                continue
            if task.state in _PENDING:
                return task
            if spec.unique_for is not None and task.unique_until and now < task.unique_until:
                return task
        return None

    def _debounced(self, spec: TaskSpec, now: datetime) -> tuple[Task, bool]:
        assert spec.debounce is not None
        for task in self._tasks.values():
            if (
                task.namespace == spec.namespace
                and task.debounce_key == spec.debounce_key
                and task.state is TaskState.SCHEDULED
                and task.attempt == 0
            ):
                until = task.debounce_until or now
                moved = dataclasses.replace(
                    task,
                    run_at=max(task.run_at, min(now + spec.debounce, until)),
                    payload=spec.payload,
                    content_type=spec.content_type,
                    trace_context=spec.trace_context,
                )
                self._tasks[task.id] = moved
                return moved, False
        most = spec.debounce_max or default_debounce_max(spec.debounce)
        return self._create(spec, now + spec.debounce, debounce_until=now + most), True

    def _create(
        self, spec: TaskSpec, run_at: datetime, debounce_until: datetime | None = None
    ) -> Task:
        fields = {f.name for f in dataclasses.fields(Task)}
        carried = {k: v for k, v in dataclasses.asdict(spec).items() if k in fields}
        carried["labels"], carried["trace_context"] = spec.labels, spec.trace_context
        task = Task(
            **{
                **carried,
                "id": str(uuid.uuid4()),
                "state": TaskState.SCHEDULED,
                "run_at": run_at,
                "partition": 0,
                "bucket": 0,
                "created_at": self.clock(),
                "unique_until": run_at + spec.unique_for if spec.unique_for else None,
                "debounce_until": debounce_until,
            }
        )
        self._tasks[task.id] = task
        return task

    # ------------------------------------------------------------------ reads and cancel

    def get(self, namespace: str, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None or task.namespace != namespace:
            raise as_remote(errors.TaskNotFound(task_id, namespace))
        return task

    def cancel(self, namespace: str, task_id: str) -> Task:
        with self._lock:
            task = self.get(namespace, task_id)
            if task.state not in (TaskState.SCHEDULED, TaskState.READY):
                raise as_remote(errors.InvalidTransition(task_id, task.state.name, "cancel"))
            done = dataclasses.replace(task, state=TaskState.CANCELLED, finished_at=self.clock())
            self._tasks[task_id] = done
            return done

    def tasks(self, namespace: str) -> list[Task]:
        return [t for t in self._tasks.values() if t.namespace == namespace]

    def clear(self) -> None:
        with self._lock:
            self._tasks.clear()
            self.runs.clear()

    # ------------------------------------------------------------------ runs

    def next_task(self, namespace: str, due: datetime | None, only: set[str] | None) -> Task | None:
        """The next task to run (earliest run_at, then priority); None: none. ``due``: only
        tasks with run_at at or before it; ``only``: only these ids."""
        with self._lock:
            ready = [
                t
                for t in self._tasks.values()
                if t.namespace == namespace
                and t.state in (TaskState.SCHEDULED, TaskState.READY)
                and (due is None or t.run_at <= due)
                and (only is None or t.id in only)
            ]
        return min(ready, key=lambda t: (t.run_at, -t.priority), default=None)

    def start(self, task: Task) -> Task:
        """``task`` RUNNING under its next attempt, as a claim leaves it."""
        with self._lock:
            now = self.clock()
            running = dataclasses.replace(
                task,
                state=TaskState.RUNNING,
                attempt=task.attempt + 1,
                worker_id=WORKER_ID,
                fired_at=task.fired_at or now,
                lease_until=now + task.lease_timeout,
            )
            self._tasks[task.id] = running
            return running

    def settle(self, task: Task, error: BaseException | None) -> Run:
        """``task``'s attempt ended: SUCCEEDED, or DEAD / back to SCHEDULED after a backoff,
        as the node decides (``chronoq.retry.after_failure``)."""
        now = self.clock()
        if error is None:
            done = dataclasses.replace(
                task, state=TaskState.SUCCEEDED, finished_at=now, lease_until=None
            )
        else:
            state, when = retry.after_failure(
                attempt=task.attempt,
                max_attempts=task.max_attempts,
                retry_base=task.retry_base,
                backoff_initial_ms=int(task.backoff_initial / timedelta(milliseconds=1)),
                backoff_max_ms=int(task.backoff_max / timedelta(milliseconds=1)),
                now=now,
                horizon=self.limits.horizon,
                fatal=isinstance(error, FatalTaskError),
            )
            done = dataclasses.replace(
                task,
                state=state,
                run_at=task.run_at if state is TaskState.DEAD else when,
                last_error=f"{type(error).__name__}: {error}",
                finished_at=now if state is TaskState.DEAD else None,
                lease_until=None,
                worker_id=None,
            )
        with self._lock:
            self._tasks[task.id] = done
            run = Run(done, error)
            self.runs.append(run)
            return run


def _handler_map(handlers: Handlers) -> dict[str, Handler]:
    if handlers is None:
        return {}
    if isinstance(handlers, TaskRegistry):
        return handlers.handlers() if len(handlers) else {}
    return dict(handlers)


def _matches(
    task: Task, queue: str | None, state: TaskState | None, fields: dict[str, Any]
) -> bool:
    if queue is not None and task.queue != queue:
        return False
    if state is not None and task.state is not state:
        return False
    for name, want in fields.items():
        if name == "data":
            got: Any = decode_payload(task.payload, task.content_type)
        elif name == "labels":
            got, want = dict(task.labels), dict(want)
        else:
            got = getattr(task, name)
        if got != want:
            return False
    return True


class _Recording:
    """What both stand-ins add to their client: the recorded tasks and the assertions."""

    _ledger: TaskLedger
    _handlers: dict[str, Handler]

    @property
    def ledger(self) -> TaskLedger:
        return self._ledger

    @property
    def runs(self) -> builtins.list[Run]:
        """Every handler run so far, in order."""
        return builtins.list(self._ledger.runs)

    def submitted(
        self, queue: str | None = None, *, state: TaskState | None = None, **fields: Any
    ) -> builtins.list[Task]:
        """The accepted tasks (in submit order) of ``queue``, in ``state``, whose fields equal
        ``fields`` (``data=`` compares the decoded payload, ``labels=`` a dict)."""
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(Task)} - {"data"})
        if unknown:
            raise errors.ConfigError(f"submitted(): no task field {', '.join(unknown)}")
        return [
            t for t in self._ledger.tasks(self._namespace()) if _matches(t, queue, state, fields)
        ]

    def assert_submitted(
        self, queue: str, *, count: int | None = None, **fields: Any
    ) -> builtins.list[Task]:
        """The tasks ``submitted(queue, **fields)`` answers; AssertionError when there are
        none (or not ``count``), listing what was submitted instead."""
        found = self.submitted(queue, **fields)
        if (count is None and not found) or (count is not None and len(found) != count):
            seen = [(t.queue, t.payload[:60]) for t in self._ledger.tasks(self._namespace())]
            wanted = "some" if count is None else str(count)
            raise AssertionError(
                f"expected {wanted} task(s) on {queue!r} with {fields}, found {len(found)}; "
                f"submitted: {seen}"
            )
        return found

    def payloads(
        self, queue: str | None = None, *, state: TaskState | None = None, **fields: Any
    ) -> builtins.list[Any]:
        """The decoded payloads (JSON values, else bytes) of ``submitted(...)``."""
        return [
            decode_payload(t.payload, t.content_type)
            for t in self.submitted(queue, state=state, **fields)
        ]

    def assert_nothing_submitted(self, queue: str | None = None) -> None:
        found = self.submitted(queue)
        if found:
            raise AssertionError(f"expected no task, found {[(t.queue, t.id) for t in found]}")

    def clear(self) -> None:
        """Forget every task and run (between tests, with a shared client)."""
        self._ledger.clear()

    def _namespace(self) -> str:
        raise NotImplementedError

    def _handler(self, task: Task) -> Handler:
        handler = self._handlers.get(task.queue)
        if handler is None:
            raise errors.ConfigError(
                f"no handler for queue {task.queue!r}: give handlers= (a TaskRegistry or "
                f"{{queue: handler}}) to run it (it has {', '.join(self._handlers) or 'none'})"
            )
        return handler


def _unsupported(original: Callable[..., Any]) -> Callable[..., Any]:
    name = original.__name__

    @functools.wraps(original)
    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise InMemoryUnsupported(
            f"{type(self).__name__}.{name} is not modelled in memory; "
            "run this test against a real node (chronoq.local)"
        )

    return refuse


def _refuse_the_rest(stand_in: type, real: type) -> None:
    """Every public method of ``real`` that ``stand_in`` does not model raises
    ``InMemoryUnsupported`` (with the real signature), instead of reaching for a channel."""
    for name, value in inspect.getmembers(real, callable):
        if name.startswith("_") or name in stand_in.__dict__ or isinstance(value, type):
            continue
        if any(name in vars(base) for base in stand_in.__mro__ if base not in real.__mro__):
            continue
        setattr(stand_in, name, _unsupported(value))


class InMemoryClient(_Recording, Client):
    """``Client`` without a node: submits are checked and recorded, handlers run in the caller
    at once (``eager=True``) or on ``run_all()`` / ``run_due(now)``."""

    def __init__(
        self,
        *,
        handlers: Handlers = None,
        eager: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        clock: Clock = _system_now,
        ledger: TaskLedger | None = None,
    ) -> None:
        """``handlers``: what runs a task's queue (a ``TaskRegistry``, read when a task runs,
        so tasks registered later count; or ``{queue: handler}``). ``clock``: the node's now,
        from which a ``delay`` is measured."""
        self.target = "in-memory"
        self.namespace = namespace
        self.timeout = 30.0
        self.failovers = 0
        self.eager = eager
        self._handler_source = handlers
        self._handlers = _handler_map(handlers)
        self._ledger = ledger or TaskLedger(clock=clock)
        self._depth = 0

    def _namespace(self) -> str:
        return self.namespace

    def _handler(self, task: Task) -> Handler:
        self._handlers = _handler_map(self._handler_source)
        return super()._handler(task)

    @property
    def addresses(self) -> builtins.list[str]:
        return []

    async def close(self) -> None:
        pass

    async def wait_ready(self, timeout: float = 10.0) -> None:
        pass

    async def submit(self, queue: str, **fields: Any) -> Submitted:
        """Submit one task; see ``NewTask`` for the fields (run_at or delay, payload, ...)."""
        (one,) = await self.submit_many([NewTask(queue=queue, **fields)])
        return one

    async def submit_many(self, tasks: Sequence[NewTask]) -> builtins.list[Submitted]:
        out = self._ledger.accept(self._keyed(tasks))
        if self.eager:
            await self._run({s.task.id for s in out if s.created}, None)
            out = [Submitted(self._ledger.get(self.namespace, s.task.id), s.created) for s in out]
        return out

    async def submit_ids(self, tasks: Sequence[NewTask]) -> builtins.list[tuple[str, bool]]:
        return [(s.task.id, s.created) for s in await self.submit_many(tasks)]

    async def get(self, task_id: str) -> Task:
        return self._ledger.get(self.namespace, task_id)

    async def cancel(self, task_id: str) -> Task:
        return self._ledger.cancel(self.namespace, task_id)

    async def run_all(self) -> builtins.list[Run]:
        """Run every pending task, whatever its run_at, and those their handlers submit, and
        their retries, until none is left; the runs in order."""
        return await self._run(None, None)

    async def run_due(self, now: datetime | None = None) -> builtins.list[Run]:
        """Run the pending tasks whose run_at is at or before ``now`` (default: the clock)."""
        return await self._run(None, now or self._ledger.clock())

    async def _run(self, only: set[str] | None, due: datetime | None) -> builtins.list[Run]:
        self._depth += 1
        try:
            if self._depth > 100:
                raise errors.ConfigError("eager handlers submitting tasks nest over 100 deep")
            runs: builtins.list[Run] = []
            while (task := self._ledger.next_task(self.namespace, due, only)) is not None:
                if len(runs) >= MAX_RUNS:
                    raise errors.ConfigError(f"more than {MAX_RUNS} runs: do handlers loop?")
                handler = self._handler(task)  # before it starts: a missing one changes nothing
                runs.append(await self._run_one(self._ledger.start(task), handler))
            return runs
        finally:
            self._depth -= 1

    async def _run_one(self, task: Task, handler: Handler) -> Run:
        ctx = TaskContext(task=task, worker_id=WORKER_ID)
        try:
            if inspect.iscoroutinefunction(handler):
                await handler(ctx)
            else:
                answer = await asyncio.to_thread(handler, ctx)  # as the worker runs it
                if inspect.isawaitable(answer):
                    await answer
        except Exception as exc:  # noqa: BLE001 - a handler's failure is the task's, as on a worker
            return self._ledger.settle(task, exc)
        return self._ledger.settle(task, None)


_refuse_the_rest(InMemoryClient, Client)


class InMemorySyncClient(_Recording, SyncClient):
    """``SyncClient`` without a node: the ``InMemoryClient``'s calls, blocking. Bind it to a
    ``TaskRegistry`` (``tasks.bind(client)``) and the blocking helpers (``schedule``) use it."""

    def __init__(
        self,
        *,
        handlers: Handlers = None,
        eager: bool = False,
        namespace: str = DEFAULT_NAMESPACE,
        clock: Clock = _system_now,
    ) -> None:
        self._memory = InMemoryClient(
            handlers=handlers, eager=eager, namespace=namespace, clock=clock
        )
        self._client = self._memory  # what SyncClient's properties read
        self._ledger = self._memory.ledger
        self._handlers = self._memory._handlers
        self._closed = False

    def _namespace(self) -> str:
        return self._memory.namespace

    def _call(self, call: Coroutine[Any, Any, Any]) -> Any:
        """``call`` to its end from blocking code: here, or in a thread of its own when this
        thread runs a loop already (a sync view under an async test)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(call)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = asyncio.run(call)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name="chronoq-in-memory")
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    @property
    def eager(self) -> bool:
        return self._memory.eager

    @property
    def addresses(self) -> builtins.list[str]:
        return []

    def close(self) -> None:
        self._closed = True

    def wait_ready(self, timeout: float = 10.0) -> None:
        pass

    def submit(self, queue: str, **fields: Any) -> Submitted:
        result: Submitted = self._call(self._memory.submit(queue, **fields))
        return result

    async def asubmit(self, queue: str, **fields: Any) -> Submitted:
        return await self._memory.submit(queue, **fields)

    def submit_many(self, tasks: Sequence[NewTask]) -> builtins.list[Submitted]:
        result: builtins.list[Submitted] = self._call(self._memory.submit_many(tasks))
        return result

    def submit_ids(self, tasks: Sequence[NewTask]) -> builtins.list[tuple[str, bool]]:
        result: builtins.list[tuple[str, bool]] = self._call(self._memory.submit_ids(tasks))
        return result

    def get(self, task_id: str) -> Task:
        return self._ledger.get(self._memory.namespace, task_id)

    def cancel(self, task_id: str) -> Task:
        return self._ledger.cancel(self._memory.namespace, task_id)

    def run_all(self) -> builtins.list[Run]:
        """``InMemoryClient.run_all``, blocking."""
        result: builtins.list[Run] = self._call(self._memory.run_all())
        return result

    def run_due(self, now: datetime | None = None) -> builtins.list[Run]:
        """``InMemoryClient.run_due``, blocking."""
        result: builtins.list[Run] = self._call(self._memory.run_due(now))
        return result


_refuse_the_rest(InMemorySyncClient, SyncClient)
