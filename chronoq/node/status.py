"""Domain errors → gRPC status codes, in one table."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from chronoq import errors

log = logging.getLogger("chronoq.node")

STATUS_OF: dict[type[errors.ChronoqError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.TaskNotFound: grpc.StatusCode.NOT_FOUND,
    errors.ScheduleNotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.StaleLease: grpc.StatusCode.FAILED_PRECONDITION,
    errors.InvalidTransition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.FenceRejected: grpc.StatusCode.FAILED_PRECONDITION,
    errors.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.CoordinatorUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.NamespaceDenied: grpc.StatusCode.PERMISSION_DENIED,
}


def code_for(exc: errors.ChronoqError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[R]]


def translated(fn: Handler[R]) -> Handler[R]:
    """Wrap a servicer method so domain errors become statuses with their message."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> R:
        try:
            return await fn(self, request, context)
        except errors.ChronoqError as exc:
            await context.abort(code_for(exc), exc.message)
            raise  # abort raises; this line is for type checkers

    return wrapper
