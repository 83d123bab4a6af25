"""OpenTelemetry traces through a real node (PostgreSQL, gRPC) and a real worker: one trace
per task from the submitter's span to the handler run, carried on the task itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import timedelta
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from chronoq import tracing
from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc
from chronoq.client import Client, NewTask, TaskContext, Worker
from chronoq.models import TaskState
from chronoq.node import Node
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    for variable in tracing.ENDPOINT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    exporter = InMemorySpanExporter()
    assert tracing.configure(service_name="chronoq-test", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


@pytest.fixture
async def live(make_node: NodeFactory) -> AsyncIterator[tuple[Node, Client]]:
    node = await make_node()  # system clock: tasks come due by themselves
    client = Client(node.address, timeout=10)
    try:
        yield node, client
    finally:
        await client.close()


async def _run_until(
    client: Client, handlers: dict[str, Any], task_id: str, state: TaskState
) -> None:
    worker = Worker(client, handlers, concurrency=2)
    run = asyncio.create_task(worker.run())
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while (await client.get(task_id)).state is not state:
            assert asyncio.get_running_loop().time() < deadline, f"task never reached {state}"
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await run


def _named(
    spans: Sequence[ReadableSpan], name: str, kind: SpanKind | None = None
) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name and (kind is None or s.kind == kind)]


async def test_submit_fire_claim_and_run_share_the_submitters_trace(
    spans: InMemorySpanExporter, live: tuple[Node, Client]
) -> None:
    _, client = live

    async def handler(ctx: TaskContext) -> None:
        pass

    submitted = await client.submit("traced", delay=timedelta(milliseconds=300))
    task = submitted.task
    assert task.state is TaskState.SCHEDULED, "fired by the owner, not at submit"
    assert dict(task.trace_context)["traceparent"].startswith("00-")
    await _run_until(client, {"traced": handler}, task.id, TaskState.SUCCEEDED)

    done = spans.get_finished_spans()
    [client_span] = _named(done, tracing.SPAN_SUBMIT, SpanKind.CLIENT)
    [node_span] = _named(done, tracing.SPAN_SUBMIT, SpanKind.SERVER)
    [fire] = _named(done, tracing.SPAN_FIRE)
    [claim] = _named(done, tracing.SPAN_CLAIM)
    [run] = _named(done, tracing.SPAN_RUN)
    trace_id = client_span.context.trace_id
    for span in (node_span, fire, claim, run):
        assert span.context.trace_id == trace_id, span.name
        assert span.parent is not None and span.parent.span_id == client_span.context.span_id
    # The stored context is the client's span: what the worker got back from its claim.
    stored = (await client.get(task.id)).trace_context
    assert f"{trace_id:032x}-{client_span.context.span_id:016x}" in dict(stored)["traceparent"]
    assert run.attributes is not None and run.attributes["chronoq.task.id"] == task.id
    assert run.status.status_code is not StatusCode.ERROR
    assert fire.attributes is not None and fire.attributes["chronoq.lateness_s"] >= 0
    # chronoq uses a provider of its own: the process-global one stays the application's.
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)


async def test_trace_context_survives_a_retry(
    spans: InMemorySpanExporter, live: tuple[Node, Client]
) -> None:
    _, client = live
    attempts: list[int] = []

    async def flaky(ctx: TaskContext) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    submitted = await client.submit(
        "flaky",
        delay=timedelta(milliseconds=200),
        max_attempts=3,
        backoff_initial=timedelta(milliseconds=100),
        backoff_max=timedelta(milliseconds=200),
    )
    await _run_until(client, {"flaky": flaky}, submitted.task.id, TaskState.SUCCEEDED)
    assert attempts == [1, 2]

    done = spans.get_finished_spans()
    [client_span] = _named(done, tracing.SPAN_SUBMIT, SpanKind.CLIENT)
    runs = sorted(_named(done, tracing.SPAN_RUN), key=lambda s: s.start_time or 0)
    claims = _named(done, tracing.SPAN_CLAIM)
    fires = _named(done, tracing.SPAN_FIRE)
    assert len(runs) == 2 and len(claims) == 2 and len(fires) == 2, [s.name for s in done]
    for span in (*runs, *claims, *fires):
        assert span.context.trace_id == client_span.context.trace_id, span.name
    assert [r.attributes["chronoq.attempt"] for r in runs if r.attributes] == [1, 2]
    assert runs[0].status.status_code is StatusCode.ERROR
    assert runs[1].status.status_code is not StatusCode.ERROR


async def test_a_tracing_node_gives_untraced_submits_its_own_context(
    spans: InMemorySpanExporter, live: tuple[Node, Client]
) -> None:
    node, client = live
    async with grpc.aio.insecure_channel(node.address) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        spec = tasks_pb2.TaskSpec(queue="raw")
        spec.delay.FromTimedelta(timedelta(seconds=60))
        resp = await stub.Submit(tasks_pb2.SubmitRequest(task=spec))
    [node_span] = _named(spans.get_finished_spans(), tracing.SPAN_SUBMIT, SpanKind.SERVER)
    assert node_span.parent is None, "a new trace starts at the node"
    stored = dict((await client.get(resp.task.id)).trace_context)
    assert f"{node_span.context.trace_id:032x}" in stored["traceparent"]


async def test_a_tracing_node_gives_an_untraced_columnar_batch_its_own_context(
    spans: InMemorySpanExporter, live: tuple[Node, Client]
) -> None:
    node, client = live
    async with grpc.aio.insecure_channel(node.address) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        shared = tasks_pb2.TaskSpec(queue="rawcols")
        shared.delay.FromTimedelta(timedelta(seconds=60))
        request = tasks_pb2.SubmitBatchRequest(
            ids_only=True, shared=shared, count=3, idempotency_keys=["a", "b", "c"]
        )
        resp = await stub.SubmitBatch(request)
    [node_span] = _named(spans.get_finished_spans(), tracing.SPAN_SUBMIT, SpanKind.SERVER)
    assert node_span.attributes is not None and node_span.attributes["chronoq.tasks"] == 3
    for task_id in resp.ids:
        stored = dict((await client.get(task_id)).trace_context)
        assert f"{node_span.context.trace_id:032x}" in stored["traceparent"]


async def test_a_bad_trace_context_is_refused_with_invalid_argument(
    live: tuple[Node, Client],
) -> None:
    node, _ = live
    async with grpc.aio.insecure_channel(node.address) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        spec = tasks_pb2.TaskSpec(queue="raw", trace_context={"Bad Key": "x"})
        spec.delay.FromTimedelta(timedelta(seconds=60))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Submit(tasks_pb2.SubmitRequest(task=spec))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "trace_context" in (info.value.details() or "")


async def test_off_by_default_no_spans_and_nothing_stored(
    live: tuple[Node, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in tracing.ENDPOINT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert tracing.ENABLED is False and tracing._provider is None
    assert tracing.configure_from_env("chronoq-test") is False, "no endpoint: stays off"
    _, client = live
    ran: list[str] = []

    async def handler(ctx: TaskContext) -> None:
        ran.append(ctx.id)

    [submitted] = await client.submit_many(
        [NewTask(queue="plain", delay=timedelta(milliseconds=200))]
    )
    assert submitted.task.trace_context == ()
    await _run_until(client, {"plain": handler}, submitted.task.id, TaskState.SUCCEEDED)
    assert ran == [submitted.task.id]
    assert (await client.get(submitted.task.id)).trace_context == ()
    assert tracing.ENABLED is False and tracing._provider is None and tracing._tracer is None
