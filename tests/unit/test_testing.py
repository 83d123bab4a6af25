"""chronoq.testing: the in-memory stand-ins check a submit as a node does, record it, and run
handlers eagerly or on demand; their signatures are the real clients'."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronoq import errors
from chronoq.client import Client, FatalTaskError, NewTask, SyncClient, TaskContext, TaskRegistry
from chronoq.models import TaskState
from chronoq.testing import InMemoryClient, InMemorySyncClient, InMemoryUnsupported

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(value)
        for name, value in inspect.getmembers(cls, callable)
        if not name.startswith("_") and not isinstance(value, type)
    }


@pytest.mark.parametrize(
    ("real", "stand_in"), [(Client, InMemoryClient), (SyncClient, InMemorySyncClient)]
)
def test_the_stand_ins_have_every_method_of_the_real_clients_with_its_signature(
    real: type, stand_in: type
) -> None:
    theirs, ours = public_methods(real), public_methods(stand_in)
    assert set(theirs) <= set(ours)
    for name, signature in theirs.items():
        assert ours[name] == signature, name
    assert issubclass(stand_in, real)


def test_submit_takes_exactly_the_real_submit_signature() -> None:
    for real, stand_in in ((Client, InMemoryClient), (SyncClient, InMemorySyncClient)):
        for name in ("submit", "submit_many", "submit_ids", "get", "cancel"):
            assert inspect.signature(getattr(stand_in, name)) == inspect.signature(
                getattr(real, name)
            )
    assert inspect.signature(InMemorySyncClient.asubmit) == inspect.signature(SyncClient.asubmit)


@pytest.mark.parametrize(
    ("fields", "error", "names"),
    [
        ({"backoff_initial": timedelta(hours=2), "backoff_max": timedelta(hours=1)}, errors.BadRequest, "backoff"),
        ({"delay": timedelta(days=5000)}, errors.BadRequest, "delay"),
        ({"run_at": T0, "delay": timedelta(1)}, errors.BadRequest, "run_at or delay"),
        ({"payload": {1, 2}}, errors.PayloadNotJSON, ""),
        ({"labels": {"bad key!": "x"}}, errors.BadRequest, "labels"),
        ({"unique_for": timedelta(days=90), "unique_key": "k"}, errors.BadRequest, "unique_for"),
        ({"idempotency_key": "x" * 10_000}, errors.BadRequest, "idempotency_key"),
    ],
)
def test_a_field_a_node_refuses_is_refused_with_the_nodes_error(
    fields: dict[str, Any], error: type[Exception], names: str
) -> None:
    client = InMemorySyncClient()
    with pytest.raises(error) as caught:
        client.submit("emails", **fields)
    assert names in str(caught.value)
    assert client.submitted() == []


def test_an_unknown_field_or_a_bad_queue_fails_as_live() -> None:
    client = InMemorySyncClient()
    with pytest.raises(TypeError, match="colour"):
        client.submit("emails", colour="red")
    with pytest.raises(errors.BadRequest, match="queue"):
        client.submit("no spaces allowed")


def test_every_field_is_recorded_with_the_node_defaults_for_the_rest() -> None:
    clock = Clock()
    client = InMemorySyncClient(clock=clock)
    done = client.submit(
        "emails",
        delay=timedelta(minutes=5),
        payload={"to": "ada@example.com"},
        max_attempts=7,
        lease_timeout=timedelta(minutes=2),
        priority=3,
        concurrency_key="customer-1",
        labels={"tenant": "acme"},
    )
    assert done.created
    (task,) = client.assert_submitted("emails", data={"to": "ada@example.com"})
    assert task == done.task
    assert (task.state, task.run_at, task.max_attempts, task.priority) == (
        TaskState.SCHEDULED,
        T0 + timedelta(minutes=5),
        7,
        3,
    )
    assert task.lease_timeout == timedelta(minutes=2)
    assert task.backoff_initial == timedelta(seconds=1)  # the node's default
    assert task.content_type == "application/json"
    assert (task.concurrency_key, task.labels) == ("customer-1", (("tenant", "acme"),))
    assert task.idempotency_key  # the client gave it one, as the real client does
    assert client.payloads("emails") == [{"to": "ada@example.com"}]
    assert client.submitted("emails", labels={"tenant": "acme"}) == [task]
    assert client.submitted("other") == []
    with pytest.raises(AssertionError, match="found 0"):
        client.assert_submitted("emails", data={"to": "bob@example.com"})
    with pytest.raises(errors.ConfigError, match="colour"):
        client.submitted(colour="red")


def test_an_idempotency_key_or_a_pending_unique_key_answers_the_first_task() -> None:
    client = InMemorySyncClient()
    first = client.submit("emails", idempotency_key="k1")
    again = client.submit("emails", idempotency_key="k1", payload=b"other")
    assert (again.task.id, again.created) == (first.task.id, False)
    a = client.submit("reports", unique_key="r")
    b = client.submit("reports", unique_key="r")
    assert (b.task.id, b.created) == (a.task.id, False)
    client.cancel(a.task.id)
    c = client.submit("reports", unique_key="r")
    assert c.created and c.task.id != a.task.id
    assert len(client.submitted()) == 3


def test_debounce_moves_the_pending_task_and_takes_the_last_payload() -> None:
    clock = Clock()
    client = InMemorySyncClient(clock=clock)
    first = client.submit("index", debounce_key="doc", debounce=timedelta(seconds=10), payload=1)
    clock.now += timedelta(seconds=4)
    second = client.submit("index", debounce_key="doc", debounce=timedelta(seconds=10), payload=2)
    assert (second.task.id, second.created) == (first.task.id, False)
    assert second.task.run_at == T0 + timedelta(seconds=14)
    assert client.payloads("index") == [2]


def test_eager_mode_runs_the_handler_at_submit_and_records_the_outcome() -> None:
    seen: list[Any] = []
    client = InMemorySyncClient(handlers={"emails": lambda ctx: seen.append(ctx.data)}, eager=True)
    done = client.submit("emails", delay=timedelta(hours=1), payload={"to": "a"})
    assert seen == [{"to": "a"}]
    assert done.task.state is TaskState.SUCCEEDED and done.task.attempt == 1
    assert client.submitted(state=TaskState.SUCCEEDED) == [done.task]


def test_a_failing_handler_is_retried_to_its_max_attempts_then_dead() -> None:
    calls: list[int] = []

    def flaky(ctx: TaskContext) -> None:
        calls.append(ctx.attempt)
        raise RuntimeError("smtp down")

    client = InMemorySyncClient(handlers={"emails": flaky})
    task = client.submit("emails", max_attempts=3).task
    runs = client.run_all()
    assert calls == [1, 2, 3]
    assert [r.task.state for r in runs] == [TaskState.SCHEDULED] * 2 + [TaskState.DEAD]
    dead = client.get(task.id)
    assert (dead.state, dead.last_error) == (TaskState.DEAD, "RuntimeError: smtp down")


def test_a_fatal_error_kills_the_task_without_a_retry() -> None:
    def fatal(ctx: TaskContext) -> None:
        raise FatalTaskError("bad address")

    client = InMemorySyncClient(handlers={"emails": fatal})
    client.submit("emails", max_attempts=5)
    (run,) = client.run_all()
    assert run.task.state is TaskState.DEAD and isinstance(run.error, FatalTaskError)


async def test_run_due_honours_run_at_and_run_all_runs_what_handlers_submit() -> None:
    clock = Clock()
    order: list[str] = []

    async def first(ctx: TaskContext) -> None:
        order.append("first")
        await client.submit("second", delay=timedelta(days=1))

    client = InMemoryClient(
        clock=clock, handlers={"first": first, "second": lambda ctx: order.append("second")}
    )
    await client.submit("first", delay=timedelta(minutes=1))
    assert await client.run_due(T0) == []  # not due yet
    assert len(await client.run_due(T0 + timedelta(minutes=1))) == 1
    assert order == ["first"]
    assert len(await client.run_all()) == 1  # the day-later task, whatever its run_at
    assert order == ["first", "second"]


def test_a_task_without_a_handler_is_refused_and_left_as_it_was() -> None:
    client = InMemorySyncClient(handlers={"emails": lambda ctx: None})
    task = client.submit("reports").task
    with pytest.raises(errors.ConfigError, match="no handler for queue 'reports'"):
        client.run_all()
    assert client.get(task.id) == task


def test_a_registry_bound_to_the_stand_in_submits_through_it() -> None:
    tasks = TaskRegistry()
    sent: list[str] = []

    @tasks.task(queue="welcome", max_attempts=5)
    def welcome(ctx: TaskContext) -> None:
        sent.append(ctx.data["email"])

    client = InMemorySyncClient(handlers=tasks)
    tasks.bind(client)
    welcome.schedule_in(timedelta(seconds=1), payload={"email": "ada@example.com"})
    (task,) = client.assert_submitted("welcome", count=1, max_attempts=5)
    client.run_all()
    assert sent == ["ada@example.com"]
    assert client.get(task.id).state is TaskState.SUCCEEDED


async def test_the_async_stand_in_serves_aschedule_and_submit_many() -> None:
    tasks = TaskRegistry()

    @tasks.task(queue="welcome", lease_timeout=timedelta(seconds=30))
    async def welcome(ctx: TaskContext) -> None:
        pass

    client = InMemoryClient(handlers=tasks, eager=True)
    tasks.bind(client)
    done = await welcome.aschedule_in(timedelta(seconds=1), payload={"email": "x"})
    assert done.task.state is TaskState.SUCCEEDED
    many = await client.submit_many([NewTask(queue="welcome"), NewTask(queue="welcome")])
    assert [s.task.state for s in many] == [TaskState.SUCCEEDED] * 2
    assert len(client.runs) == 3
    tasks.bind(None)


async def test_a_call_that_is_not_modelled_says_so() -> None:
    client = InMemoryClient()
    with pytest.raises(InMemoryUnsupported, match=r"InMemoryClient\.status"):
        await client.status()
    with pytest.raises(InMemoryUnsupported, match="pause_queue"):
        InMemorySyncClient().pause_queue("emails")
    with pytest.raises(errors.NotFound):
        await client.get("no-such-task")
