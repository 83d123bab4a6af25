"""Arbitrary requests to every RPC of a real node: only documented status codes, a node that
stays healthy, and another namespace's task that fires on time and runs once.

Messages are built from the protobuf descriptors, so a new RPC or field is fuzzed without a
change here: extreme numbers, long strings, NUL, open enum values, huge repeated fields, and
raw bytes that are not a message at all (garbage, a string field with invalid UTF-8).

The default run is short (``FUZZ_EXAMPLES``, a few hundred cases over every RPC); set
``CHRONOQ_FUZZ_EXAMPLES`` for a longer one, e.g. ``CHRONOQ_FUZZ_EXAMPLES=5000``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronoq.api.v1 import (
    cluster_pb2,
    schedules_pb2,
    tasks_pb2,
    tasks_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from chronoq.node import Node
from tests.integration.conftest import NodeFactory

# Hypothesis draws in a thread while the node's loops run on the event loop, where backoff
# jitter uses the global random module: hypothesis would blame its strategies for that.
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
FUZZ_EXAMPLES = int(os.environ.get("CHRONOQ_FUZZ_EXAMPLES", "300"))
CANARY = "canary"  # the other tenant: no generated request names it
#: Every status the API documents for bad or unlucky input. UNKNOWN (an unhandled exception),
#: INTERNAL (a bug) and UNAVAILABLE (a node that fell over) are findings.
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
WITH_AUTH = DOCUMENTED | {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
CALL_TIMEOUT = 30.0  # seconds; a call that takes this long is a finding too


@dataclass(frozen=True)
class Rpc:
    path: str  # /package.Service/Method
    request: descriptor.Descriptor


def rpcs(*, admin: bool) -> list[Rpc]:
    """Every unary RPC of the four chronoq services. ``Drain`` only with ``admin``: it stops
    the node firing, which is its documented effect, and would starve the canary."""
    found = []
    for module in (tasks_pb2, worker_pb2, cluster_pb2, schedules_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if method.name == "Drain" and not admin:
                    continue
                found.append(Rpc(f"/{service.full_name}/{method.name}", method.input_type))
    return found


# ---------------------------------------------------------------- values

INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
NAMES = ["", "default", "fuzz", "q", "a.b:c-d_e"]
NASTY = [
    "q\n",
    "q\x00",
    "\x00",
    "x" * 129,
    "y" * 5000,
    "é",
    "../etc",
    "America",
    "Europe/Paris",
    "0 0 31 2 *",
    "*/5 * * * *",
    "* * * * * * *",
    str(uuid.UUID(int=0)),
    str(uuid.uuid4()),
    "{" + str(uuid.UUID(int=1)) + "}",
]
STRINGS = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(NASTY),
    st.text(max_size=40),
).filter(lambda s: s != CANARY)
#: Ids of tasks made before the run (ready, running and dead ones), so that calls on ids reach
#: the store's state changes and not only "not found".
SEEDED: list[str] = []
SEEDED_IDS = st.integers(0, 10**6).map(lambda i: SEEDED[i % len(SEEDED)] if SEEDED else "")
#: Plausible values by field name: a request valid but for one or two fields gets further.
PLAUSIBLE: dict[str, st.SearchStrategy[str]] = {
    "namespace": st.sampled_from(["", "default", "fuzz"]),
    "queue": st.sampled_from(["q", "fuzz"]),
    "queues": st.sampled_from(["q", "fuzz"]),
    "name": st.sampled_from(["s1", "s2"]),
    "id": SEEDED_IDS,
    "task_id": SEEDED_IDS,
    "ids": SEEDED_IDS,
    "cron": st.sampled_from(["* * * * *", "*/5 * * * *", "0 0 29 2 *"]),
    "timezone": st.sampled_from(["", "UTC", "Europe/Paris", "Asia/Kolkata"]),
    "idempotency_key": st.sampled_from(["k1", "k2", ""]),
}
SMALL_INTS = {"lease_token", "max_tasks", "page_size", "bucket_horizon", "max_attempts"}
#: Times and durations near now and zero, besides the extremes.
NEAR = {"seconds": st.integers(0, 120), "nanos": st.just(0)}


def ints(kind: int) -> st.SearchStrategy[int]:
    low, high = INT_RANGES[kind]
    edges = [v for v in (0, 1, 2, 3, -1, low, high, 2**31 - 1, 2**31, 10**11) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in INT_RANGES:
        if field.name in SMALL_INTS or kind == FieldDescriptor.TYPE_ENUM:
            return st.one_of(st.integers(0, 4), ints(kind))
        if field.name in NEAR:
            return st.one_of(NEAR[field.name], ints(kind))
        return ints(kind)
    if kind == FieldDescriptor.TYPE_STRING:
        plausible = PLAUSIBLE.get(field.name)
        return STRINGS if plausible is None else st.one_of(plausible, STRINGS)
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"p" * (256 * 1024 + 1)))
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        width = 32 if kind == FieldDescriptor.TYPE_FLOAT else 64
        return st.floats(width=width, allow_nan=True, allow_infinity=True)
    raise AssertionError(f"no strategy for field type {kind} of {field.full_name}")


def is_small(field: FieldDescriptor) -> bool:
    """Repeated fields cheap to send thousands of (names, ids, leases): caps are fuzzed too."""
    return field.type == FieldDescriptor.TYPE_STRING or (
        field.message_type is not None and field.message_type.name == "Lease"
    )


def repeated(field: FieldDescriptor, item: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    few = st.lists(item, max_size=3)
    if not is_small(field):
        return few
    return few.flatmap(lambda xs: st.sampled_from([xs, xs * 700]) if xs else st.just(xs))


def set_field(msg: Message, field: FieldDescriptor, v: Any) -> None:
    name = field.name
    if is_map(field):
        getattr(msg, name).update(v)
    elif field.is_repeated:
        target = getattr(msg, name)
        if field.message_type is not None:
            for item in v:
                if item is not None:
                    target.add().CopyFrom(item)
        else:
            target.extend(v)
    elif field.message_type is not None:
        getattr(msg, name).CopyFrom(v)
    else:
        setattr(msg, name, v)


def is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


@functools.cache
def messages(desc: descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of type ``desc``: each field set or not, nested messages up to a depth."""
    cls = message_factory.GetMessageClass(desc)

    def value(field: FieldDescriptor) -> st.SearchStrategy[Any]:
        if is_map(field):  # e.g. a task's trace context: more entries than the cap, too
            entry = field.message_type.fields_by_name
            return st.dictionaries(scalar(entry["key"]), scalar(entry["value"]), max_size=12)
        if field.message_type is not None:
            if depth >= 3:
                return st.just(None)
            item = messages(field.message_type, depth + 1)
        else:
            item = scalar(field)
        return repeated(field, item) if field.is_repeated else item

    fields = {f.name: st.one_of(st.none(), value(f)) for f in desc.fields}

    def build(values: dict[str, Any]) -> Message:
        msg = cls()
        for name, v in values.items():
            if v is not None:
                set_field(msg, desc.fields_by_name[name], v)
        return msg

    return st.fixed_dictionaries(fields).map(build)


def bad_utf8(desc: descriptor.Descriptor) -> bytes:
    """A valid encoding of an empty message plus a string field holding invalid UTF-8."""
    strings = [f for f in desc.fields if f.type == FieldDescriptor.TYPE_STRING]
    if not strings:
        return b"\xff\xff\xff"
    tag = (strings[0].number << 3) | 2
    return bytes([tag]) + b"\x02\xff\xfe" if tag < 128 else b"\xff\xfe"


def requests(rpc: Rpc) -> st.SearchStrategy[bytes]:
    """What goes on the wire for ``rpc``: mostly encoded messages, some that are not."""
    return st.one_of(
        messages(rpc.request).map(lambda m: m.SerializeToString()),
        st.binary(min_size=1, max_size=64),
        st.just(bad_utf8(rpc.request)),
    )


# ---------------------------------------------------------------- the run


@dataclass
class Tally:
    """What the fuzzer saw: cases per RPC and status codes."""

    cases: Counter[str]
    codes: Counter[str]

    def report(self) -> str:
        lines = [f"fuzz: {sum(self.cases.values())} cases over {len(self.cases)} RPCs"]
        lines += [f"  {code}: {n}" for code, n in self.codes.most_common()]
        return "\n".join(lines)


async def fuzz(
    node: Node, allowed: set[grpc.StatusCode], *, admin: bool, metadata: Any = None
) -> Tally:
    """Run ``FUZZ_EXAMPLES`` cases against ``node`` in a thread (hypothesis is synchronous);
    the calls themselves run on this event loop, which the node serves on."""
    loop = asyncio.get_running_loop()
    tally = Tally(Counter(), Counter())
    channel = grpc.aio.insecure_channel(
        node.address, options=[("grpc.max_send_message_length", 512 * 1024 * 1024)]
    )
    methods = rpcs(admin=admin)
    stubs: dict[str, Callable[..., Any]] = {
        rpc.path: channel.unary_unary(rpc.path)
        for rpc in methods  # bytes in, bytes out
    }

    async def send(path: str, body: bytes) -> grpc.StatusCode:
        try:
            await stubs[path](body, timeout=CALL_TIMEOUT, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    # Every RPC gets its share: a draw over all of them may leave one out.
    per_rpc = -(-FUZZ_EXAMPLES // len(methods))

    def one_rpc(rpc: Rpc) -> None:
        @settings(
            max_examples=per_rpc,
            deadline=None,
            database=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
                HealthCheck.large_base_example,
            ],
        )
        @given(body=requests(rpc))
        def one(body: bytes) -> None:
            code = asyncio.run_coroutine_threadsafe(send(rpc.path, body), loop).result(
                CALL_TIMEOUT + 10
            )
            tally.cases[rpc.path] += 1
            tally.codes[code.name] += 1
            assert code in allowed, f"{rpc.path} answered {code.name} to {body[:200]!r}"

        one()

    def every_rpc() -> None:
        for rpc in methods:
            one_rpc(rpc)

    try:
        await asyncio.to_thread(every_rpc)
    finally:
        print(tally.report())
        await channel.close()
    return tally


async def serving(node: Node) -> bool:
    async with grpc.aio.insecure_channel(node.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def submit_canary(node: Node, metadata: Any = None) -> tasks_pb2.Task:
    async with grpc.aio.insecure_channel(node.address) as channel:
        spec = tasks_pb2.TaskSpec(namespace=CANARY, queue=CANARY)
        spec.delay.FromTimedelta(timedelta(seconds=2))
        reply = await tasks_pb2_grpc.TaskServiceStub(channel).Submit(
            tasks_pb2.SubmitRequest(task=spec), timeout=10, metadata=metadata
        )
    return reply.task


async def run_canary(node: Node, canary: tasks_pb2.Task, metadata: Any = None) -> None:
    """The canary fired on time (within a generous bound for a busy two-core machine), is
    claimed once, completes, and nothing else is left to claim."""
    async with grpc.aio.insecure_channel(node.address) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        workers = worker_pb2_grpc.WorkerServiceStub(channel)
        claim = worker_pb2.ClaimRequest(namespace=CANARY, queues=[CANARY], max_tasks=10)
        claim.wait.FromTimedelta(timedelta(seconds=1))
        claimed = []
        for _ in range(20):  # bounded: the canary was due long ago
            claimed = list((await workers.Claim(claim, timeout=10, metadata=metadata)).tasks)
            if claimed:
                break
        assert [t.id for t in claimed] == [canary.id]
        (task,) = claimed
        assert task.attempt == 1
        late = task.fired_at.ToDatetime() - task.run_at.ToDatetime()
        assert timedelta(0) <= late < timedelta(seconds=5), late
        lease = worker_pb2.Lease(task_id=task.id, lease_token=task.attempt)
        done = await workers.Complete(
            worker_pb2.CompleteRequest(namespace=CANARY, lease=lease),
            timeout=10,
            metadata=metadata,
        )
        assert done.state == tasks_pb2.TASK_STATE_SUCCEEDED
        claim.ClearField("wait")
        again = await workers.Claim(claim, timeout=10, metadata=metadata)
        assert not again.tasks
        listed = await tasks.ListTasks(
            tasks_pb2.ListTasksRequest(namespace=CANARY), timeout=10, metadata=metadata
        )
        assert [(t.id, t.attempt) for t in listed.tasks] == [(canary.id, 1)]


async def fuzz_node(make_node: NodeFactory, **settings: Any) -> Node:
    # Short long-polls: a fuzzed wait must not hold a case for a minute.
    return await make_node(max_claim_wait=timedelta(milliseconds=200), **settings)


async def seed(node: Node, metadata: Any = None) -> None:
    """Tasks for the fuzzer to act on, in each namespace it uses: ready ones, running ones
    (lease token 1) and dead ones."""
    SEEDED.clear()
    async with grpc.aio.insecure_channel(node.address) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        workers = worker_pb2_grpc.WorkerServiceStub(channel)
        for namespace in ("default", "fuzz"):
            specs = [tasks_pb2.TaskSpec(namespace=namespace, queue="q") for _ in range(6)]
            for spec in specs:
                spec.delay.FromTimedelta(timedelta(0))
            submitted = await tasks.SubmitBatch(
                tasks_pb2.SubmitBatchRequest(tasks=specs), timeout=10, metadata=metadata
            )
            SEEDED.extend(t.id for t in submitted.tasks)
            claim = worker_pb2.ClaimRequest(namespace=namespace, queues=["q"], max_tasks=4)
            claimed = (await workers.Claim(claim, timeout=10, metadata=metadata)).tasks
            for task in claimed[:2]:
                lease = worker_pb2.Lease(task_id=task.id, lease_token=task.attempt)
                await workers.Fail(
                    worker_pb2.FailRequest(namespace=namespace, lease=lease, fatal=True),
                    timeout=10,
                    metadata=metadata,
                )


@pytest.mark.timeout(900)
async def test_fuzz_every_rpc(make_node: NodeFactory) -> None:
    node = await fuzz_node(make_node)
    await seed(node)
    canary = await submit_canary(node)
    tally = await fuzz(node, DOCUMENTED, admin=False)
    assert sum(tally.cases.values()) >= FUZZ_EXAMPLES
    assert set(tally.cases) == {rpc.path for rpc in rpcs(admin=False)}
    assert await serving(node)
    await run_canary(node, canary)


@pytest.mark.timeout(900)
async def test_fuzz_as_a_tenant(make_node: NodeFactory, tmp_path: Path) -> None:
    """With auth on, a tenant's token reaches its namespaces only: cluster-wide calls (Drain
    included) and other namespaces answer PERMISSION_DENIED, nothing else changes."""
    tokens = tmp_path / "tokens.toml"
    tenant, admin = "fuzz-tenant-" + "t" * 32, "fuzz-admin-" + "a" * 32
    tokens.write_text(f'[tokens]\n"{tenant}" = ["default", "fuzz", "q"]\n"{admin}" = ["*"]\n')
    tokens.chmod(0o600)
    node = await fuzz_node(make_node, auth_tokens=str(tokens))
    as_admin = [("authorization", f"Bearer {admin}")]
    await seed(node, as_admin)
    canary = await submit_canary(node, as_admin)
    tally = await fuzz(
        node, WITH_AUTH, admin=True, metadata=[("authorization", f"Bearer {tenant}")]
    )
    assert sum(tally.cases.values()) >= FUZZ_EXAMPLES
    assert await serving(node)
    await run_canary(node, canary, as_admin)
