"""OpenTelemetry spans for a task's life: submit (client and node), fire, claim, handler run.

One trace per task, from the submitter to the worker: the W3C trace context travels ON the
task (``TaskSpec.trace_context``, stored in ``tasks.trace_context``, returned on claim), so
the node that fires it and the worker that runs it, hours later and in other processes, add
their spans to the submitter's trace. A task is traced when it carries a context: the
client injects the current one at submit, and a node that traces gives its submit span's
context to the tasks that come without one.

Off by default. ``configure`` (or ``configure_from_env``: ``CHRONOQ_OTLP_ENDPOINT`` or the
standard ``OTEL_EXPORTER_OTLP_ENDPOINT``) turns it on, with the optional packages of the
``tracing`` extra. Until then every hook below returns after one check of the module flag
``ENABLED``: nothing is imported, allocated or stored. The provider is this module's own,
never the process-global one, so an application's OpenTelemetry setup is left alone (its
current span still becomes the parent of a client's submit span).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, Coroutine, MutableMapping, Sequence
from typing import Any, ParamSpec, TypeVar

from chronoq.errors import ConfigError
from chronoq.models import Task
from chronoq.tracecontext import Carrier, from_json

log = logging.getLogger("chronoq.tracing")

#: True once ``configure`` succeeded; the one thing every hook reads when tracing is off.
ENABLED = False

TRACER_NAME = "chronoq"
SPAN_SUBMIT = "chronoq.submit"
SPAN_FIRE = "chronoq.fire"
SPAN_CLAIM = "chronoq.claim"
SPAN_RUN = "chronoq.run"
#: Where ``configure_from_env`` looks for the OTLP (gRPC) endpoint, first found wins.
ENDPOINT_VARIABLES = (
    "CHRONOQ_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)
INSTALL_HINT = "tracing needs the optional packages: pip install 'chronoq[tracing]'"

_provider: Any = None
_tracer: Any = None
_propagator: Any = None
_kinds: Any = None  # opentelemetry.trace.SpanKind, once configured
#: Parsed parent contexts by carrier; cleared when full (a bound, not an LRU).
PARENTS_CACHED = 1024
_parents: dict[Carrier, Any] = {}

P = ParamSpec("P")
R = TypeVar("R")


def configure(endpoint: str | None = None, *, service_name: str, exporter: Any = None) -> bool:
    """Turn tracing on for this process: spans go to the OTLP/gRPC ``endpoint`` (batched), or
    to ``exporter`` (e.g. an in-memory one, span by span). Neither: stays off (False).

    A second call while on changes nothing. ``ConfigError`` without the optional packages.
    """
    global ENABLED, _provider, _tracer, _propagator, _kinds
    if ENABLED:
        return True
    if exporter is None and not endpoint:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise ConfigError(INSTALL_HINT) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is None:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError(INSTALL_HINT) from exc
        # An http:// endpoint is plaintext, https:// TLS (the exporter reads the scheme).
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _provider = provider
    _tracer = provider.get_tracer(TRACER_NAME)
    _propagator = TraceContextTextMapPropagator()
    _kinds = trace.SpanKind
    ENABLED = True
    log.info("tracing on: service %s, exporting to %s", service_name, endpoint or exporter)
    return True


def configure_from_env(
    service_name: str, endpoint: str | None = None, *, strict: bool = False
) -> bool:
    """``configure`` with ``endpoint``, else the first of ``ENDPOINT_VARIABLES`` that is set;
    off when none is. Without the optional packages: ``ConfigError`` when ``strict`` (an
    operator's flag), else a warning, and tracing stays off."""
    if ENABLED:
        return True
    endpoint = endpoint or next(
        (os.environ[v] for v in ENDPOINT_VARIABLES if os.environ.get(v)), None
    )
    if not endpoint:
        return False
    try:
        return configure(endpoint, service_name=service_name)
    except ConfigError as exc:
        if strict:
            raise
        log.warning("%s (an OTLP endpoint is set: %s)", exc, endpoint)
        return False


def shutdown() -> None:
    """Export what is buffered and turn tracing off again."""
    global ENABLED, _provider, _tracer, _propagator, _kinds
    provider, ENABLED = _provider, False
    _provider = _tracer = _propagator = _kinds = None
    _parents.clear()
    if provider is not None:
        provider.shutdown()


# ------------------------------------------------------------------------------ the hooks


def inject(carrier: MutableMapping[str, str]) -> None:
    """Write the current trace context into a task's ``trace_context`` (client side)."""
    if not ENABLED:
        return
    _propagator.inject(carrier)


def _parent(entries: Carrier) -> Any:
    """The context a carrier names, parsed once: the tasks of one submit share a carrier."""
    context = _parents.get(entries)
    if context is None:
        if len(_parents) >= PARENTS_CACHED:
            _parents.clear()
        context = _parents[entries] = _propagator.extract(dict(entries))
    return context


def _task_attributes(task: Task) -> dict[str, Any]:
    return {
        "chronoq.task.id": task.id,
        "chronoq.namespace": task.namespace,
        "chronoq.queue": task.queue,
        "chronoq.attempt": task.attempt,
    }


def client_span(method: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """A client's submit call as a CLIENT span; the tasks it sends carry its context."""

    @functools.wraps(method)
    async def traced(*args: P.args, **kwargs: P.kwargs) -> R:
        if not ENABLED:
            return await method(*args, **kwargs)
        with _tracer.start_as_current_span(SPAN_SUBMIT, kind=_kinds.CLIENT) as span:
            span.set_attribute("chronoq.namespace", str(getattr(args[0], "namespace", "")))
            return await method(*args, **kwargs)

    return traced


def node_submit(method: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """A node's Submit or SubmitBatch as a SERVER span, child of the first task's context;
    tasks that came without a context get this span's (so every task submitted through a
    tracing node is traced)."""

    @functools.wraps(method)
    async def traced(*args: P.args, **kwargs: P.kwargs) -> R:
        if not ENABLED:
            return await method(*args, **kwargs)
        request: Any = args[1]
        if not hasattr(request, "tasks"):
            specs: Sequence[Any] = [request.task]
        elif request.tasks or not request.HasField("shared"):
            specs = request.tasks
        else:  # the columnar form: its tasks' context is the shared spec's
            specs = [request.shared]
        # Not through the cache: this carrier is not checked yet (the servicer checks it).
        parent = _propagator.extract(dict(specs[0].trace_context)) if specs else None
        with _tracer.start_as_current_span(
            SPAN_SUBMIT,
            context=parent,
            kind=_kinds.SERVER,
            attributes={"chronoq.tasks": getattr(request, "count", 0) or len(specs)},
        ):
            for spec in specs:
                if not spec.trace_context:
                    _propagator.inject(spec.trace_context)
            return await method(*args, **kwargs)

    return traced


def fired(traced: Sequence[tuple[str, float]], node_id: str) -> None:
    """A fire span per fired task that carries a trace context (its lateness as attribute)."""
    if not ENABLED or not traced:
        return
    last, parent = None, None
    for stored, lateness in traced:
        if stored != last:  # a batch's tasks come in runs of one stored context
            last, parent = stored, _parent(from_json(stored))
        span = _tracer.start_span(
            SPAN_FIRE,
            context=parent,
            attributes={"chronoq.lateness_s": float(lateness), "chronoq.node": node_id},
        )
        span.end()


def claimed(tasks: Sequence[Task], worker_id: str) -> None:
    """A claim span per claimed task that carries a trace context."""
    if not ENABLED:
        return
    for task in tasks:
        if task.trace_context:
            span = _tracer.start_span(
                SPAN_CLAIM,
                context=_parent(task.trace_context),
                kind=_kinds.SERVER,
                attributes={**_task_attributes(task), "chronoq.worker": worker_id},
            )
            span.end()


H = TypeVar("H", bound=Callable[..., Any])


def traced_handler(handler: H, task: Task) -> H:
    """``handler`` itself, or (tracing on, task traced) a wrapper of the same kind (coroutine
    function or plain) that runs it in a CONSUMER span of the task's trace; a handler error
    is recorded on the span."""
    if not ENABLED or not task.trace_context:
        return handler
    parent = _parent(task.trace_context)
    attributes = _task_attributes(task)

    if inspect.iscoroutinefunction(handler):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with _tracer.start_as_current_span(
                SPAN_RUN, context=parent, kind=_kinds.CONSUMER, attributes=attributes
            ):
                return await handler(*args, **kwargs)

        return run_async  # type: ignore[return-value]

    def run(*args: Any, **kwargs: Any) -> Any:
        with _tracer.start_as_current_span(
            SPAN_RUN, context=parent, kind=_kinds.CONSUMER, attributes=attributes
        ):
            return handler(*args, **kwargs)

    return run  # type: ignore[return-value]
