"""The byte-bounded pipe between a COPY out of the source and a COPY into the target."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from typing import Any


class _Pipe:
    """Bytes from one COPY ... TO STDOUT to one COPY ... FROM STDIN, at most ``limit`` held
    (one chunk more than that when the pipe is empty: a row larger than the bound)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._held = 0
        self._closed = False
        self._error: BaseException | None = None
        self._changed = asyncio.Condition()
        self.on_progress: Any = None  # called whenever bytes go in or out

    async def put(self, data: bytes) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: (
                    self._error is not None
                    or self._held == 0
                    or self._held + len(data) <= self._limit
                )
            )
            if self._error is not None:
                raise self._error
            self._chunks.append(bytes(data))
            self._held += len(data)
            self._changed.notify_all()
            if self.on_progress is not None:
                self.on_progress()

    async def close(self, error: BaseException | None = None) -> None:
        async with self._changed:
            self._closed = True
            if error is not None and self._error is None:
                self._error = error
            self._changed.notify_all()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._read()

    async def _read(self) -> AsyncIterator[bytes]:
        while True:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: bool(self._chunks) or self._closed or self._error is not None
                )
                if self._error is not None:
                    raise self._error
                if not self._chunks:
                    return
                chunk = self._chunks.popleft()
                self._held -= len(chunk)
                self._changed.notify_all()
                if self.on_progress is not None:
                    self.on_progress()
            yield chunk


def _copied(status: str) -> int:
    """Rows of a ``COPY n`` status."""
    return int(status.split()[-1]) if status else 0


async def _both(first: Awaitable[Any], second: Awaitable[Any]) -> tuple[Any, Any]:
    """Run two halves of a stream; the first failure cancels the other and is raised."""
    a = asyncio.ensure_future(first)
    b = asyncio.ensure_future(second)
    try:
        done, _ = await asyncio.wait((a, b), return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return await a, await b
    finally:
        for task in (a, b):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            elif not task.cancelled():
                task.exception()  # both halves can fail (a killed server): both retrieved
