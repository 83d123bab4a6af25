"""The trace context a task carries: bounded at the edge, stored as JSON, read back safely;
and the tracing hooks when tracing is off (the default): they hand everything back untouched."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq import tracing
from chronoq.errors import InvalidArgument
from chronoq.models import Task, TaskState
from chronoq.tracecontext import (
    MAX_ENTRIES,
    MAX_KEY_CHARS,
    MAX_VALUE_CHARS,
    check_carrier,
    from_json,
    to_json,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

keys = st.from_regex(rf"[a-z0-9][a-z0-9_.*/-]{{0,{MAX_KEY_CHARS - 1}}}", fullmatch=True)
values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=MAX_VALUE_CHARS)
carriers = st.dictionaries(keys, values, max_size=MAX_ENTRIES)


@given(carriers)
def test_a_valid_carrier_round_trips_through_the_store_form(entries: dict[str, str]) -> None:
    carrier = check_carrier(entries)
    assert dict(carrier) == entries
    assert list(carrier) == sorted(carrier)
    assert from_json(to_json(carrier)) == carrier
    assert (to_json(carrier) is None) == (not entries)


@given(st.one_of(st.none(), st.text(max_size=200)))
def test_any_stored_value_reads_without_failing(stored: str | None) -> None:
    carrier = from_json(stored)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in carrier)


@pytest.mark.parametrize(
    "entries",
    [
        {f"k{i}": "v" for i in range(MAX_ENTRIES + 1)},
        {"Traceparent": TRACEPARENT},
        {"has space": "v"},
        {"k" * (MAX_KEY_CHARS + 1): "v"},
        {"traceparent": "x" * (MAX_VALUE_CHARS + 1)},
        {"traceparent": "line\nbreak"},
        {"traceparent": "caf\u00e9"},
    ],
)
def test_bad_carriers_are_invalid_arguments(entries: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_carrier(entries)
    assert info.value.field == "trace_context"


def test_stored_garbage_reads_as_untraced() -> None:
    assert from_json('["a"]') == ()
    assert from_json("{not json") == ()
    assert from_json('{"traceparent": 1, "tracestate": "a=b"}') == (("tracestate", "a=b"),)


def test_hooks_are_no_ops_while_tracing_is_off() -> None:
    assert tracing.ENABLED is False
    task = Task(
        id="t",
        namespace="n",
        queue="q",
        state=TaskState.RUNNING,
        run_at=datetime(2030, 1, 1, tzinfo=UTC),
        partition=0,
        bucket=0,
        trace_context=(("traceparent", TRACEPARENT),),
    )

    def handler(ctx: object) -> None:
        pass

    assert tracing.traced_handler(handler, task) is handler
    carrier: dict[str, str] = {}
    tracing.inject(carrier)
    assert carrier == {}
    tracing.fired([(json.dumps({"traceparent": TRACEPARENT}), 0.5)], "node")
    tracing.claimed([task], "worker")
    assert tracing._provider is None


def test_configure_without_an_endpoint_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in tracing.ENDPOINT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert tracing.configure(service_name="x") is False
    assert tracing.configure_from_env("x") is False
    assert tracing.ENABLED is False


def test_configure_from_the_standard_variable_exports_over_otlp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exporter is only built here (nothing listens: no span is sent)."""
    for variable in tracing.ENDPOINT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    try:
        assert tracing.configure_from_env("chronoq-test") is True
        assert tracing.ENABLED and tracing._provider is not None
        assert tracing._provider.resource.attributes["service.name"] == "chronoq-test"
    finally:
        tracing.shutdown()
    assert tracing.ENABLED is False
