"""A task's queue controls through a real node: every field submitted (SDK, task definition,
CLI, a mixed batch) is stored and read back by GetTask, its first key places it, and a bad
field is refused with INVALID_ARGUMENT naming it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import pytest

from chronoq import errors
from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc
from chronoq.client import Client, NewTask, TaskRegistry
from chronoq.node import Node
from chronoq.routing import key_partition
from tests.integration.conftest import NodeFactory
from tests.integration.test_cli import cli, failed, ok

pytestmark = pytest.mark.timeout(60)

PARTITIONS = 16
LATER = timedelta(hours=1)  # no task here comes due while the test runs


@pytest.fixture
async def live(make_node: NodeFactory) -> Node:
    return await make_node()


@pytest.fixture
async def client(live: Node) -> AsyncIterator[Client]:
    c = Client(live.address, timeout=10)
    try:
        yield c
    finally:
        await c.close()


EVERY = {
    "concurrency_key": "customer-1",
    "unique_key": "report-1",
    "unique_for": timedelta(minutes=10),
    "debounce_key": "sync-1",
    "debounce": timedelta(seconds=5),
    "debounce_max": timedelta(minutes=1),
    "labels": {"team": "billing", "tier": "gold"},
}


async def test_every_control_is_stored_and_read_back(client: Client) -> None:
    submitted = await client.submit("controls", delay=LATER, payload={"n": 1}, **EVERY)
    assert submitted.created
    task = await client.get(submitted.task.id)
    assert task == submitted.task
    assert (task.concurrency_key, task.unique_key, task.debounce_key) == (
        "customer-1",
        "report-1",
        "sync-1",
    )
    assert task.labels == (("team", "billing"), ("tier", "gold"))
    # the windows' ends: from run_at (unique) and from the submit (debounce)
    assert task.unique_until == task.run_at + timedelta(minutes=10)
    assert task.created_at is not None and task.debounce_until is not None
    assert abs(task.debounce_until - (task.created_at + timedelta(minutes=1))) < timedelta(
        seconds=1
    )
    # placed by its concurrency key, not by the idempotency key the SDK gave it
    assert task.idempotency_key
    assert task.partition == key_partition("default", "customer-1", PARTITIONS)


async def test_debounce_max_defaults_to_ten_debounces(client: Client) -> None:
    submitted = await client.submit(
        "controls", delay=LATER, debounce_key="d-default", debounce=timedelta(seconds=3)
    )
    task = submitted.task
    assert task.created_at is not None and task.debounce_until is not None
    assert abs(task.debounce_until - (task.created_at + timedelta(seconds=30))) < timedelta(
        seconds=1
    )


async def test_a_task_without_controls_has_none(client: Client) -> None:
    task = (await client.submit("controls", delay=LATER)).task
    assert (task.concurrency_key, task.unique_key, task.debounce_key) == (None, None, None)
    assert (task.unique_until, task.debounce_until, task.labels) == (None, None, ())


async def test_a_batch_mixing_plain_and_controlled_tasks_keeps_each_its_own(
    client: Client,
) -> None:
    """The batch check's quick path (plain specs) and long path (controlled ones), and the
    insert's columns sent once or per row, give each task its own fields."""
    tasks = [
        NewTask(queue="controls", delay=LATER, payload=b"plain"),
        NewTask(queue="controls", delay=LATER, concurrency_key="c-2", labels={"a": "1"}),
        NewTask(queue="controls", delay=LATER, payload=b"plain"),
        NewTask(queue="controls", delay=LATER, unique_key="u-2"),
        NewTask(queue="controls", delay=LATER, concurrency_key="c-3", labels={"b": "2"}),
    ]
    results = await client.submit_many(tasks)
    got = [await client.get(r.task.id) for r in results]
    assert [t.concurrency_key for t in got] == [None, "c-2", None, None, "c-3"]
    assert [t.unique_key for t in got] == [None, None, None, "u-2", None]
    assert [t.labels for t in got] == [(), (("a", "1"),), (), (), (("b", "2"),)]
    assert got[1].partition == key_partition("default", "c-2", PARTITIONS)
    assert got[3].partition == key_partition("default", "u-2", PARTITIONS)
    ids = await client.submit_ids(tasks[1:2])
    assert (await client.get(ids[0][0])).labels == (("a", "1"),)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"debounce": timedelta(seconds=5)}, "debounce"),
        ({"unique_for": timedelta(minutes=1)}, "unique_for"),
        ({"concurrency_key": "k" * 129}, "concurrency_key"),
        ({"labels": {f"k{i}": "v" for i in range(17)}}, "labels"),
        ({"labels": {"bad key": "v"}}, "labels"),
        ({"unique_key": "u", "unique_for": timedelta(days=31)}, "unique_for"),
        (
            {
                "debounce_key": "d",
                "debounce": timedelta(minutes=2),
                "debounce_max": timedelta(minutes=1),
            },
            "debounce_max",
        ),
    ],
)
async def test_a_bad_control_is_refused_naming_the_field(
    live: Node, fields: dict[str, object], field: str
) -> None:
    spec = NewTask(queue="controls", delay=LATER, **fields).to_pb("default")  # type: ignore[arg-type]
    async with grpc.aio.insecure_channel(live.address) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        for call in (
            stub.Submit(tasks_pb2.SubmitRequest(task=spec), timeout=10),
            stub.SubmitBatch(tasks_pb2.SubmitBatchRequest(tasks=[spec]), timeout=10),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert field in (info.value.details() or "")


async def test_a_task_definition_computes_its_keys_from_the_payload(client: Client) -> None:
    tasks = TaskRegistry(client)

    @tasks.task(
        queue="per-customer",
        concurrency_key=lambda data: data["customer"],
        labels=lambda data: {"customer": data["customer"]},
        unique_key="nightly",
        unique_for=timedelta(minutes=5),
    )
    def handle(ctx: object) -> None:  # pragma: no cover - never run here
        pass

    first = await handle.aschedule_in(LATER, payload={"customer": "acme"})
    assert first.task.concurrency_key == "acme"
    assert first.task.labels == (("customer", "acme"),)
    assert first.task.unique_key == "nightly"
    # a value given at submit wins over the definition's
    other = await handle.aschedule_in(
        LATER, payload={"customer": "acme"}, unique_key="other", concurrency_key="fixed"
    )
    assert (other.task.unique_key, other.task.concurrency_key) == ("other", "fixed")
    # a function that fails is refused before anything is sent, naming its field
    with pytest.raises(errors.BadRequest, match="concurrency_key"):
        await handle.aschedule_in(LATER, payload={"no customer": 1})


async def test_the_cli_submits_every_control(live: Node, client: Client) -> None:
    out = ok(
        await cli(
            "submit", "controls", "--in", "1h", "--address", live.address,
            "--concurrency-key", "cli-c", "--unique-key", "cli-u", "--unique-for", "10m",
            "--debounce-key", "cli-d", "--debounce", "5s", "--debounce-max", "1m",
            "--label", "team=ops", "--label", "tier=gold",
        )
    )
    task = await client.get(out.strip().splitlines()[-1])
    assert (task.concurrency_key, task.unique_key, task.debounce_key) == (
        "cli-c",
        "cli-u",
        "cli-d",
    )
    assert task.unique_until == task.run_at + timedelta(minutes=10)
    assert task.labels == (("team", "ops"), ("tier", "gold"))
    failed(
        await cli("submit", "controls", "--address", live.address, "--label", "novalue"),
        2,
        "--label",
    )
    failed(
        await cli("submit", "controls", "--address", live.address, "--debounce", "5s"),
        1,
        "debounce",
    )


async def test_concurrent_submits_of_one_key_land_in_one_partition(client: Client) -> None:
    results = await asyncio.gather(
        *(client.submit("controls", delay=LATER, concurrency_key="same") for _ in range(8))
    )
    assert {r.task.partition for r in results} == {key_partition("default", "same", PARTITIONS)}
