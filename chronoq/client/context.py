"""What a handler gets and may raise: the task's context, and the error that fails a task
without a retry. Apart from the worker that runs handlers, so handler code (and the demo's)
depends on these values only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chronoq.client.payload import decode as decode_payload
from chronoq.errors import PayloadNotJSON
from chronoq.models import Task


class FatalTaskError(Exception):
    """Raise from a handler to fail the task without retrying it (it goes DEAD)."""


@dataclass
class TaskContext:
    """What a handler gets: the task, its attempt and idempotency key, and a cancel signal."""

    task: Task
    worker_id: str
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def attempt(self) -> int:
        return self.task.attempt

    @property
    def idempotency_key(self) -> str:
        """The client's key, or the task id when none was given: stable across attempts."""
        return self.task.idempotency_key or self.task.id

    @property
    def payload(self) -> bytes:
        return self.task.payload

    @property
    def content_type(self) -> str:
        return self.task.content_type

    @property
    def data(self) -> Any:
        """The payload decoded: the value of a JSON task, else the bytes (``payload``).

        Raises:
            FatalTaskError: a payload marked JSON that is not; no retry can change its bytes,
                so the task goes straight to the dead letters with the reason.
        """
        try:
            return decode_payload(self.task.payload, self.task.content_type)
        except PayloadNotJSON as exc:
            raise FatalTaskError(exc.message) from None

    @property
    def queue(self) -> str:
        return self.task.queue

    @property
    def run_at(self) -> datetime:
        return self.task.run_at


Handler = Callable[[TaskContext], Awaitable[Any] | Any]
