"""The client's queue controls: a task's controls written to its wire spec (none when unset),
a definition's keys computed from the payload, and ``--label k=v`` parsed."""

from __future__ import annotations

from datetime import timedelta

import pytest
import typer

from chronoq import errors
from chronoq.cli.labels import parse_labels
from chronoq.client import NewTask
from chronoq.client.controls import resolved


def test_a_task_writes_every_control_to_its_spec() -> None:
    pb = NewTask(
        queue="q",
        concurrency_key="c",
        unique_key="u",
        unique_for=timedelta(minutes=1),
        debounce_key="d",
        debounce=timedelta(seconds=2),
        debounce_max=timedelta(seconds=20),
        labels={"a": "1"},
    ).to_pb("default")
    assert (pb.concurrency_key, pb.unique_key, pb.debounce_key) == ("c", "u", "d")
    assert pb.unique_for.ToTimedelta() == timedelta(minutes=1)
    assert pb.debounce.ToTimedelta() == timedelta(seconds=2)
    assert pb.debounce_max.ToTimedelta() == timedelta(seconds=20)
    assert dict(pb.labels) == {"a": "1"}


def test_a_task_without_controls_sends_none() -> None:
    pb = NewTask(queue="q").to_pb("default")
    assert not (pb.concurrency_key or pb.unique_key or pb.debounce_key or pb.labels)
    for name in ("unique_for", "debounce", "debounce_max"):
        assert not pb.HasField(name)


def test_keys_and_labels_may_be_functions_of_the_payload() -> None:
    fields = resolved(
        {
            "concurrency_key": lambda d: d["customer"],
            "unique_key": "fixed",
            "labels": lambda d: {"customer": d["customer"]},
            "debounce_key": lambda d: None,
        },
        {"customer": "acme"},
    )
    assert fields == {
        "concurrency_key": "acme",
        "unique_key": "fixed",
        "labels": {"customer": "acme"},
        "debounce_key": None,
    }


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"concurrency_key": lambda d: d["missing"]}, "concurrency_key: the function"),
        ({"unique_key": lambda d: 7}, "unique_key: the function must answer a string"),
        ({"labels": lambda d: {"a": 1}}, "labels: the function must answer a dict"),
    ],
)
def test_a_function_that_fails_is_refused_naming_its_field(
    fields: dict[str, object], words: str
) -> None:
    with pytest.raises(errors.BadRequest, match=words):
        resolved(fields, {})


def test_labels_parse_from_key_value_options() -> None:
    assert parse_labels(["team=ops", "note=a=b", "empty="]) == {
        "team": "ops",
        "note": "a=b",
        "empty": "",
    }
    assert parse_labels(None) == {}
    for bad in (["novalue"], ["=v"], ["a=1", "a=2"]):
        with pytest.raises(typer.BadParameter):
            parse_labels(bad)
