"""JSON and bytes payloads (chronoq.client.payload) and the content type bound: what a handler
decodes is what was submitted, and what JSON cannot hold is refused before any call."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2
from chronoq.client.payload import MAX_JSON_DEPTH, decode, encode, is_json
from chronoq.client.values import NewTask
from chronoq.errors import InvalidArgument, PayloadNotJSON
from chronoq.limits import MAX_CONTENT_TYPE, check_content_type
from chronoq.models import APPLICATION_JSON, OCTET_STREAM, TaskDefaults

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(JSON_VALUES)
def test_json_values_round_trip_exactly(value: Any) -> None:
    payload, content_type = encode(value)
    assert content_type == APPLICATION_JSON
    assert decode(payload, content_type) == value


@given(st.binary())
def test_bytes_pass_unchanged(value: bytes) -> None:
    assert encode(value) == (value, OCTET_STREAM)
    assert decode(value, OCTET_STREAM) == value
    assert encode(bytearray(value), "image/png") == (value, "image/png")


def test_unicode_and_nesting_survive_as_utf8() -> None:
    value = {"名前": "Zoë 🚀", "deep": [[{"x": [None, True, 1.5, -7]}]], "": ""}
    payload, _ = encode(value)
    assert "🚀".encode() in payload  # UTF-8, not \u escapes
    assert decode(payload, "application/json; charset=utf-8") == value


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"when": datetime(2030, 1, 1, tzinfo=UTC)}, r"payload\['when'\]: type datetime"),
        ({"ids": {1, 2}}, r"payload\['ids'\]: type set"),
        ([b"raw"], r"payload\[0\]: type bytes"),
        ({1: "a"}, r"payload: key 1 is of type int"),
        ({"x": [math.nan]}, r"payload\['x'\]\[0\]: nan is not a JSON number"),
        (math.inf, r"payload: inf is not a JSON number"),
        (object(), r"payload: type object"),
    ],
)
def test_what_json_cannot_hold_is_refused_naming_where(value: Any, where: str) -> None:
    with pytest.raises(PayloadNotJSON, match=where):
        encode(value)


def test_json_error_is_raised_before_any_call() -> None:
    with pytest.raises(InvalidArgument):  # raised before the call: a field to fix
        NewTask(queue="q", payload={"x": {1}}).to_pb("default")


def test_nesting_is_bounded_both_ways() -> None:
    deep: Any = []
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = [deep]
    with pytest.raises(PayloadNotJSON, match="deeper"):
        encode(deep)
    with pytest.raises(PayloadNotJSON, match="deeper"):
        decode(b"[" * 200_000, APPLICATION_JSON)


def test_a_json_task_that_is_not_json_fails_clearly() -> None:
    with pytest.raises(PayloadNotJSON, match="not JSON"):
        decode(b"\xff{", APPLICATION_JSON)


def test_a_value_with_a_non_json_content_type_is_refused() -> None:
    with pytest.raises(PayloadNotJSON, match="needs bytes"):
        encode({"a": 1}, "text/plain")


@pytest.mark.parametrize(
    ("content_type", "json"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/vnd.api+json", True),
        ("application/octet-stream", False),
        ("text/json-ish", False),
    ],
)
def test_is_json(content_type: str, json: bool) -> None:
    assert is_json(content_type) is json


@pytest.mark.parametrize(
    "value",
    ["", "json", "a/b/c", "text /plain", "text/plain;", "text/plain; q", "é/x", "a/b\x00"],
)
def test_content_type_must_be_a_mime_type(value: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^content_type: "):
        check_content_type(value)


def test_content_type_is_bounded() -> None:
    check_content_type("a/" + "b" * (MAX_CONTENT_TYPE - 2))
    with pytest.raises(InvalidArgument, match="the limit is 128"):
        check_content_type("a/" + "b" * (MAX_CONTENT_TYPE - 1))


@given(st.text(max_size=300))
def test_content_type_check_accepts_or_names_the_field(value: str) -> None:
    try:
        assert check_content_type(value) == value
    except InvalidArgument as exc:
        assert exc.field == "content_type"


def test_content_type_travels_and_defaults_to_bytes() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    sent = NewTask(queue="q", payload={"a": 1}).to_pb("default")
    assert sent.content_type == APPLICATION_JSON
    assert convert.spec_from_pb(sent, now, TaskDefaults()).content_type == APPLICATION_JSON
    raw = NewTask(queue="q", payload=b"x").to_pb("default")
    assert raw.content_type == ""  # what a client from before the field sends
    assert convert.spec_from_pb(raw, now, TaskDefaults()).content_type == OCTET_STREAM
    assert convert.task_from_pb(tasks_pb2.Task(run_at=sent.run_at)).content_type == OCTET_STREAM
