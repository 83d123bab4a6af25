"""A worker's end of the streaming protocol: one ``Work`` call to one node.

The node pushes tasks within the credits this end grants; acks go out on the same call and
each batch's answer comes back by its ``ack_seq``. When the call ends (the node stopped, a
store error, the network), every ack still waiting for its answer fails with ``Unavailable``
and ``ended`` resolves: the worker sends those acks again by another way (completes are safe
to repeat) and opens a new stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from chronoq import errors
from chronoq.api import convert
from chronoq.api.v1 import worker_pb2
from chronoq.client.remote import translate
from chronoq.models import AckOutcome, Lease, Task

log = logging.getLogger("chronoq.worker")

#: What a write on a call that has ended raises (the reader then says why it ended).
_ENDED = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, RuntimeError)

#: Seconds a closing stream waits for the node to answer its acks in flight, give back what
#: it claimed for it, and end the call (tasks pushed meanwhile are still read).
CLOSE_GRACE = 2.5

OnTasks = Callable[[list[Task]], Awaitable[None]]


class WorkStream:
    """One open ``Work`` call; ``start`` it, then ``grant``, ``complete`` and ``close``."""

    def __init__(self, call: Any, address: str, on_tasks: OnTasks) -> None:
        self._call = call
        self.address = address
        self._on_tasks = on_tasks
        self._seq = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[list[AckOutcome]]] = {}
        self._writing = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        #: Resolves when the call has ended, with the error that ended it (None: the node
        #: closed it after this end said it was done).
        self.ended: asyncio.Future[errors.RemoteError | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.received = 0

    async def start(
        self, namespace: str, queues: Sequence[str], worker_id: str, credits: int
    ) -> None:
        """Open the stream with its first message and start reading what the node sends."""
        await self._write(
            worker_pb2.WorkRequest(
                open=worker_pb2.WorkOpen(
                    namespace=namespace, queues=list(queues), worker_id=worker_id
                ),
                credits=credits,
            )
        )
        self._reader = asyncio.create_task(self._read(), name="chronoq-work-stream")

    @property
    def open(self) -> bool:
        return not self.ended.done()

    async def grant(self, credits: int) -> None:
        """Tell the node ``credits`` more slots are free."""
        if credits > 0:
            await self._write(worker_pb2.WorkRequest(credits=credits))

    async def complete(
        self, leases: Sequence[Lease], *, credits: int = 0, timeout: float
    ) -> list[AckOutcome]:
        """Acknowledge ``leases`` (and grant ``credits`` in the same message); their results.

        Raises:
            errors.Unavailable: the stream ended, or the answer did not come within
                ``timeout`` seconds (the acks may or may not have landed: send them again).
        """
        seq = next(self._seq)
        answer: asyncio.Future[list[AckOutcome]] = asyncio.get_running_loop().create_future()
        self._waiting[seq] = answer
        try:
            await self._write(
                worker_pb2.WorkRequest(
                    complete=[convert.lease_to_pb(lease) for lease in leases],
                    ack_seq=seq,
                    credits=credits,
                )
            )
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError:
            # A node that leaves acks unanswered is not trusted with more: the stream ends,
            # so the worker opens another (the acks go again by another way).
            why = errors.Unavailable(
                f"no answer to acks within {timeout:.1f} s on the stream to {self.address}"
            )
            self._call.cancel()
            self._end(why)
            raise why from None
        finally:
            self._waiting.pop(seq, None)

    async def close(self, grace: float = CLOSE_GRACE) -> None:
        """Say this end is done, give the node ``grace`` seconds to answer acks in flight and
        end the call, then cancel it."""
        if self.open:
            with contextlib.suppress(*_ENDED):
                async with self._writing:
                    await self._call.done_writing()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await asyncio.shield(self.ended)
        self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._end(None)

    async def _write(self, request: worker_pb2.WorkRequest) -> None:
        if not self.open:
            raise self._unavailable()
        try:
            async with self._writing:
                await self._call.write(request)
        except _ENDED as exc:
            # The call ended under us; the reader says why.
            log.debug("write on the stream to %s failed: %s", self.address, exc)
            raise self._unavailable() from None

    def _unavailable(self) -> errors.Unavailable:
        why = self.ended.result() if self.ended.done() else None
        return errors.Unavailable(
            f"the work stream to {self.address} ended" + (f": {why}" if why else "")
        )

    async def _read(self) -> None:
        ended: errors.RemoteError | None = None
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                if response.ack_seq:
                    answer = self._waiting.get(response.ack_seq)
                    if answer is not None and not answer.done():
                        answer.set_result(
                            [AckOutcome(r.task_id, r.ok, r.error) for r in response.acked]
                        )
                if response.tasks:
                    tasks = [convert.task_from_pb(t) for t in response.tasks]
                    self.received += len(tasks)
                    await self._on_tasks(tasks)
        except grpc.aio.AioRpcError as exc:
            ended = translate(exc)
        except Exception as exc:  # a push this end cannot take ends the stream
            # Not the node's doing: a bug here. Said with its traceback, the call ended with
            # the reason, so the worker opens another instead of reading no more.
            log.error(
                "reading the work stream from %s failed: %r", self.address, exc, exc_info=exc
            )
            ended = errors.Unavailable(
                f"reading the work stream from {self.address} failed: {type(exc).__name__}: {exc}"
            )
            self._call.cancel()
        finally:
            self._end(ended)

    def _end(self, why: errors.RemoteError | None) -> None:
        if not self.ended.done():
            self.ended.set_result(why)
        for answer in self._waiting.values():
            if not answer.done():
                answer.set_exception(self._unavailable())
