"""Task definitions (chronoq.client.registry): defaults written once, applied to every submit,
overridable per submit; and the blocking client offers every call of the async one."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta

import pytest

from chronoq.client import Client, SyncClient, TaskContext, TaskRegistry
from chronoq.errors import ConfigError
from chronoq.models import MisfirePolicy


def handler(ctx: TaskContext) -> None:
    del ctx


def test_defaults_apply_and_submits_override_them() -> None:
    tasks = TaskRegistry()
    send = tasks.task(
        queue="emails",
        max_attempts=5,
        backoff_initial=timedelta(seconds=2),
        backoff_max=timedelta(minutes=1),
        lease_timeout=timedelta(minutes=2),
        misfire_policy=MisfirePolicy.SKIP,
        misfire_grace=timedelta(seconds=30),
        priority=3,
    )(handler)
    at = datetime(2030, 1, 1, tzinfo=UTC)
    plain = send.new(at=at, payload={"to": "a"})
    assert (plain.queue, plain.run_at, plain.payload) == ("emails", at, {"to": "a"})
    assert plain.max_attempts == 5
    assert plain.backoff_initial == timedelta(seconds=2)
    assert plain.backoff_max == timedelta(minutes=1)
    assert plain.lease_timeout == timedelta(minutes=2)
    assert plain.misfire_policy is MisfirePolicy.SKIP
    assert plain.misfire_grace == timedelta(seconds=30)
    assert plain.priority == 3
    custom = send.new(delay=timedelta(minutes=5), max_attempts=1, priority=-1, idempotency_key="k")
    assert (custom.max_attempts, custom.priority, custom.idempotency_key) == (1, -1, "k")
    assert custom.delay == timedelta(minutes=5) and custom.run_at is None
    assert custom.lease_timeout == timedelta(minutes=2)  # the rest stay


def test_unset_defaults_are_left_to_the_node() -> None:
    tasks = TaskRegistry()
    ping = tasks.task(handler)  # bare decorator: the queue is the function's name
    assert ping.queue == "handler"
    task = ping.new()
    assert task.max_attempts is None and task.lease_timeout is None


def test_definitions_are_callable_and_make_the_worker_dict() -> None:
    tasks = TaskRegistry()
    seen: list[str] = []

    @tasks.task(queue="a")
    def first(ctx: str) -> None:
        seen.append(ctx)

    first("direct")  # still the function
    assert seen == ["direct"]
    assert tasks.handlers() == {"a": first.handler}
    assert "a" in tasks and len(tasks) == 1 and tasks["a"] is first


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"lease_timeout": timedelta(seconds=-1)}, "lease_timeout"),
        ({"backoff_initial": timedelta(10), "backoff_max": timedelta(1)}, "backoff"),
        ({"queue": "bad queue"}, "queue"),
    ],
)
def test_bad_definitions_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TaskRegistry().task(**options)(handler)  # type: ignore[call-overload]


def test_a_queue_has_one_task_and_submits_name_known_fields() -> None:
    tasks = TaskRegistry()
    task = tasks.task(queue="q")(handler)
    with pytest.raises(ConfigError, match="has a task already"):
        tasks.task(queue="q")(handler)
    with pytest.raises(ConfigError, match="unknown task fields attempts"):
        task.new(attempts=3)
    with pytest.raises(ConfigError, match="no client"):
        task.schedule()
    with pytest.raises(ConfigError, match="no task registered for queue nope"):
        tasks.handlers(["nope"])


def test_blocking_schedule_needs_a_sync_client() -> None:
    tasks = TaskRegistry()
    task = tasks.task(queue="q")(handler)
    tasks.bind(object.__new__(Client))  # an async client (never connected)
    with pytest.raises(ConfigError, match="aschedule"):
        task.schedule_in(timedelta(seconds=1))


def test_sync_client_has_every_call_of_the_async_client() -> None:
    def calls(cls: type) -> dict[str, list[str]]:
        return {
            name: [p for p in inspect.signature(fn).parameters if p != "self"]
            for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    sync, asynchronous = calls(SyncClient), calls(Client)
    # A work stream pushes tasks to a callback on the event loop: a worker's call, not one
    # that a blocking caller makes.
    for name in ("open_work", "stream_failed"):
        del asynchronous[name]
    for name, params in asynchronous.items():
        assert name in sync, f"SyncClient lacks {name}"
        assert sync[name] == params, name
