"""No servicer answers UNKNOWN: domain errors keep their code, bugs become INTERNAL with a
reference instead of an internal class name, and store data errors INVALID_ARGUMENT."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import grpc
import pytest

from chronoq.errors import InvalidArgument
from chronoq.node.edge.malformed import Malformed, refusing, tolerant
from chronoq.node.edge.status import translated


class Aborted(Exception):
    pass


class FakeContext:
    """What ``translated`` uses of a servicer context: ``abort`` ends the call."""

    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise Aborted

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


class Servicer:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    @translated
    async def Call(self, request: Any, context: Any) -> None:
        raise self.exc


async def status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    context = FakeContext()
    with pytest.raises(Aborted):
        await Servicer(exc).Call(None, context)
    assert context.status is not None
    return context.status


async def test_domain_errors_keep_their_code() -> None:
    code, details = await status_of(InvalidArgument("queue", "must not be empty"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details == "queue: must not be empty"


async def test_a_bug_is_internal_with_a_reference(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="chronoq.node"):
        code, details = await status_of(KeyError("secret_internal_name"))
    assert code == grpc.StatusCode.INTERNAL
    assert details.startswith("internal error; see the node's log (ref ")
    assert "KeyError" not in details and "secret_internal_name" not in details
    ref = details.rsplit("ref ", 1)[1].rstrip(")")
    (record,) = [r for r in caplog.records if ref in r.getMessage()]
    assert record.exc_info is not None  # the traceback is in the log, once


async def test_store_data_errors_are_invalid_argument() -> None:
    exc = asyncpg.exceptions.CharacterNotInRepertoireError(
        'invalid byte sequence for encoding "UTF8": 0x00'
    )
    code, details = await status_of(exc)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "CharacterNotInRepertoire" not in details and "(ref " in details


async def test_unparsable_bytes_become_a_marker_and_invalid_argument() -> None:
    def parse(data: bytes) -> bytes:
        raise ValueError("Error parsing message")

    parsed = tolerant("/chronoq.v1.TaskService/Submit", parse)(b"\xff")
    assert isinstance(parsed, Malformed)
    reached = []

    async def behavior(request: Any, context: Any) -> None:
        reached.append(request)

    context = FakeContext()
    with pytest.raises(Aborted):
        await refusing(behavior)(parsed, context)  # type: ignore[arg-type]
    assert context.status is not None
    assert context.status[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert context.status[1].startswith("request: is not a valid message for")
    assert not reached
    await refusing(behavior)(b"fine", context)  # type: ignore[arg-type]
    assert reached == [b"fine"]
