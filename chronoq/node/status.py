"""Domain errors → gRPC status codes, in one table.

No call answers UNKNOWN: an exception that is not a ``ChronoqError`` is a bug of the node (or a
request that validation should have refused). It is logged once with its traceback under a
short reference, and the caller gets INTERNAL with that reference, without internal names.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
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
    errors.NamespaceCapReached: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ScheduleQuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.TooManyLongPolls: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.StaleLease: grpc.StatusCode.FAILED_PRECONDITION,
    errors.InvalidTransition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.FenceRejected: grpc.StatusCode.FAILED_PRECONDITION,
    errors.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.CoordinatorUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.NamespaceDenied: grpc.StatusCode.PERMISSION_DENIED,
}


#: Driver errors that may reach a servicer, by what they most likely mean. A data exception
#: (SQLSTATE class 22: a value out of a column's range, a character the encoding cannot hold)
#: comes from a request value that validation let through.
FOREIGN_STATUS: dict[type[Exception], tuple[grpc.StatusCode, str]] = {
    asyncpg.exceptions.DataError: (
        grpc.StatusCode.INVALID_ARGUMENT,
        "a value of the request is outside what the store accepts",
    ),
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
        except grpc.aio.AbortError:
            raise  # the handler ended the call with a status of its own
        except Exception as exc:  # the one place where a bug becomes a status
            code, problem = unexpected(exc, fn.__name__)
            await context.abort(code, problem)
            raise  # abort raises; this line is for type checkers

    return wrapper


def unexpected(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """Log ``exc`` once with its traceback; the status and the message for the caller."""
    ref = secrets.token_hex(4)
    code, problem = grpc.StatusCode.INTERNAL, "internal error"
    for cls in type(exc).__mro__:
        if cls in FOREIGN_STATUS:
            code, problem = FOREIGN_STATUS[cls]
            break
    log.error("%s failed (ref %s)", method, ref, exc_info=exc)
    return code, f"{problem}; see the node's log (ref {ref})"
