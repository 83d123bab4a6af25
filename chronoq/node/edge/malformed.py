"""Bytes that do not parse as the request message get INVALID_ARGUMENT, not UNKNOWN.

grpc calls a method's request deserializer before any servicer code runs, and a
``DecodeError`` there (garbage, a string field with invalid UTF-8, a truncated message) ends
the call as UNKNOWN "Unexpected DecodeError". This interceptor gives every unary method a
deserializer that returns a ``Malformed`` marker instead of raising, and a behaviour that
refuses the marker with INVALID_ARGUMENT before anything else (auth included) looks at it.
A chronoq stream (``Work``) gets the same deserializer, and its call ends with INVALID_ARGUMENT
at the first malformed message, wherever it is read. Register it first, so it wraps every
other interceptor.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message

from chronoq.errors import InvalidArgument, shown

log = logging.getLogger("chronoq.node")

#: The methods whose streams this interceptor checks (reflection's stream is not ours).
CHRONOQ_PREFIX = "/chronoq."

Behavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True)
class Malformed:
    """Stands in for a request whose bytes did not parse."""

    method: str
    problem: str


def tolerant(method: str, deserialize: Deserializer) -> Deserializer:
    """``deserialize``, returning ``Malformed`` where it would raise."""

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (message.Error, ValueError, TypeError) as exc:  # DecodeError above all
            return Malformed(method, str(exc))

    return parse


def refusing(behavior: Behavior) -> Behavior:
    """``behavior``, ending the call with INVALID_ARGUMENT for a ``Malformed`` request."""

    async def serve(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Malformed):
            log.debug("malformed request to %s from %s", request.method, context.peer())
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _invalid(request).message)
        return await behavior(request, context)

    return serve


class _MalformedMessage(InvalidArgument):
    """A malformed message read from a stream (raised where it is read)."""


def _invalid(request: Malformed) -> InvalidArgument:
    return _MalformedMessage(
        "request", f"is not a valid message for {request.method}: {shown(request.problem)}"
    )


def refusing_stream(behavior: Behavior) -> Behavior:
    """A stream's ``behavior``, reading its messages through a check for ``Malformed``."""

    async def serve(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Malformed):
                    log.debug("malformed message on %s from %s", request.method, context.peer())
                    raise _invalid(request)
                yield request

        try:
            return await behavior(checked(), context)
        except _MalformedMessage as exc:  # read before a servicer could translate it
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)

    return serve


class MalformedRequests(grpc.aio.ServerInterceptor):
    """Refuse unparsable unary requests with INVALID_ARGUMENT (see the module docstring)."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if (
            handler is not None
            and handler.stream_stream is not None
            and handler.request_deserializer is not None
            and method.startswith(CHRONOQ_PREFIX)
        ):
            return grpc.stream_stream_rpc_method_handler(
                refusing_stream(handler.stream_stream),  # type: ignore[arg-type]
                request_deserializer=tolerant(method, handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler  # other streams (reflection, health Watch) parse as grpc does
        return grpc.unary_unary_rpc_method_handler(
            refusing(handler.unary_unary),  # type: ignore[arg-type]
            request_deserializer=tolerant(method, handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
