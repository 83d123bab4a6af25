"""The mover's pipe between two COPY streams holds at most its byte bound, passes every byte
in order, and hands a failure of one side to the other."""

from __future__ import annotations

import asyncio

import pytest

from chronoq.store.mover import _Pipe


async def test_the_pipe_holds_at_most_its_bound_and_keeps_the_order() -> None:
    pipe = _Pipe(1000)
    chunks = [bytes([i % 256]) * (50 + i % 300) for i in range(400)]
    peak = 0

    async def produce() -> None:
        for chunk in chunks:
            await pipe.put(chunk)
        await pipe.close()

    async def consume() -> bytes:
        nonlocal peak
        out = bytearray()
        async for chunk in pipe:
            peak = max(peak, pipe._held + len(chunk))
            out += chunk
            await asyncio.sleep(0)  # a slower reader: the writer must wait
        return bytes(out)

    _, got = await asyncio.gather(produce(), consume())
    assert got == b"".join(chunks)
    assert peak <= 1000


async def test_a_chunk_larger_than_the_bound_passes_alone() -> None:
    pipe = _Pipe(10)
    await pipe.put(b"x" * 100)  # an empty pipe takes it
    waiting = asyncio.ensure_future(pipe.put(b"y"))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # full: the writer waits for the reader
    reader = aiter(pipe)
    assert await anext(reader) == b"x" * 100
    await waiting
    await pipe.close()
    assert await anext(reader) == b"y"


async def test_a_failed_writer_fails_the_reader() -> None:
    pipe = _Pipe(10)
    await pipe.put(b"a")
    await pipe.close(RuntimeError("source lost"))
    with pytest.raises(RuntimeError, match="source lost"):
        async for _ in pipe:
            pass
    with pytest.raises(RuntimeError):
        await pipe.put(b"b")
