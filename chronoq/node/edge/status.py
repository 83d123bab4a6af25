"""Domain errors → gRPC status codes, as each error class declares (``grpc_code``).

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
    """The status a call that failed with ``exc`` ends with: what its class declares."""
    return grpc.StatusCode[type(exc).grpc_code]


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
