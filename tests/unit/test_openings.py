"""One ``Openings`` per node, shared by the auth interceptor and the worker service (pure,
no server): a stream the interceptor opened is handed on as ``Opened``, which the shared
``Openings`` neither counts nor times again, so a stream is never refused twice for one
opening, and the caps count each opening stream once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chronoq.api.v1 import worker_pb2
from chronoq.auth import TokenAuth
from chronoq.errors import TooManyOpenings
from chronoq.node.dispatch.work_stream import Opened, Openings
from chronoq.node.edge.auth_interceptor import AuthInterceptor

WORK = "/chronoq.v1.WorkerService/Work"
TOKEN = "a-long-enough-test-token-0123456789"
OPEN = worker_pb2.WorkRequest(open=worker_pb2.WorkOpen(queues=["q"]), credits=1)


async def messages(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def silent() -> AsyncIterator[Any]:
    await asyncio.Event().wait()  # never sends
    yield None


class Context:
    def peer(self) -> str:
        return "test"

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


async def test_an_opened_stream_passes_a_full_openings_uncounted() -> None:
    openings = Openings()
    openings.cap = 1
    blocker = asyncio.create_task(openings.first(silent()))
    await asyncio.sleep(0)
    assert openings.total == 1
    with pytest.raises(TooManyOpenings):
        await openings.first(messages(OPEN))
    stream = Opened(OPEN, messages("next"))
    assert await openings.first(stream) is OPEN
    assert [m async for m in stream] == ["next"]
    assert openings.total == 1 and openings.refused == 1
    blocker.cancel()


async def test_the_interceptor_and_the_servicer_share_one_openings() -> None:
    openings = Openings()
    openings.cap = 1
    interceptor = AuthInterceptor(TokenAuth({TOKEN: ["default"]}), openings=openings)
    assert interceptor.openings is openings
    seen: list[Any] = []

    async def servicer(requests: Any, context: Any) -> None:
        # Another stream takes the node's one opening slot before the servicer looks at
        # this stream's first message: as the interceptor opened it, it is not refused.
        blocker = asyncio.create_task(openings.first(silent()))
        await asyncio.sleep(0)
        assert openings.total == 1
        seen.append(await openings.first(requests))
        blocker.cancel()

    guarded = interceptor._guard_stream(WORK, TOKEN, servicer)
    await guarded(messages(OPEN), Context())
    assert seen == [OPEN] and openings.refused == 0
