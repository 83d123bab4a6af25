"""Bearer-token auth on every chronoq RPC: who is calling, and may they touch this namespace.

A ``grpc.aio`` server interceptor sees only the method name and the metadata, not the request,
so for chronoq methods it wraps the handler's behaviour: the wrapper reads the token from the
``authorization: Bearer <token>`` metadata, finds the request's namespaces (``namespace`` of
the request, or of its ``task`` / each of its ``tasks``), checks them against the token's
grant and only then calls the servicer (a stream: its token at once, from the metadata, then
its namespaces on its first message, which must come within ``STREAM_OPEN_DEADLINE`` and is
waited for by at most ``MAX_OPENING_STREAMS`` streams at once; nothing reaches the servicer
before it passes). Health and reflection stay open,
so probes and ``grpcurl list`` need no token.

A request type with no namespace anywhere is a cluster-wide call: ``ClusterService.Status``
(read-only) takes any valid token, every other one (``Drain``, ...) a ``*`` token.

A check at the start of a call is not enough for a long-poll that waits a minute: with a token
file, every call in flight is registered under its token, and while any is open the file is
re-read each ``REVOCATION_CHECK``; a call whose token no longer passes ends at once with the
status the same call would get now (UNAUTHENTICATED for a removed token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from chronoq import tls
from chronoq.auth import TokenAuth, TokenFile, bearer_token
from chronoq.errors import ChronoqError, Unauthenticated
from chronoq.models import DEFAULT_NAMESPACE
from chronoq.node.dispatch.work_stream import Opened, Openings
from chronoq.node.edge.status import code_for

log = logging.getLogger("chronoq.auth")

#: Methods under this prefix need a token; the rest (health, reflection) do not.
GUARDED_PREFIX = "/chronoq."
#: Cluster-wide methods that any valid token may call (read-only views).
OPEN_CLUSTER_METHODS = frozenset({"/chronoq.v1.ClusterService/Status"})

#: How often tokens are re-checked for the calls in flight (the token file's own re-read
#: interval is the same).
REVOCATION_CHECK = 1.0

Behavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


def request_namespaces(request: Message) -> set[str] | None:
    """The namespaces a request acts on (empty means ``default``); None: it names none."""
    fields = request.DESCRIPTOR.fields_by_name
    if "namespace" in fields:
        return {getattr(request, "namespace") or DEFAULT_NAMESPACE}  # noqa: B009
    carriers = [
        f
        for f in request.DESCRIPTOR.fields
        if f.message_type is not None and "namespace" in f.message_type.fields_by_name
    ]
    found: set[str] | None = None
    for field in carriers:
        value = getattr(request, field.name)
        if field.is_repeated:
            items = list(value)
        elif len(carriers) == 1 or request.HasField(field.name):
            items = [value]  # left out, the only one: the request's namespace is the default
        else:
            items = []  # left out beside another (a batch's whole tasks or its shared spec)
        found = (found or set()) | {item.namespace or DEFAULT_NAMESPACE for item in items}
    return found


def _metadata_value(metadata: Any, key: str) -> str | None:
    for item_key, value in metadata or ():
        if item_key == key:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def check_call(
    auth: TokenAuth, token: str | None, namespaces: set[str] | None, method: str
) -> None:
    """Raise the ``ChronoqError`` that refuses this call under ``auth``, if any."""
    grant = auth.authenticate(token)
    if namespaces is not None or method not in OPEN_CLUSTER_METHODS:
        auth.authorize(grant, namespaces, method.rsplit("/", 1)[-1])


class _OpenCall:
    """One call in flight: what it was allowed on, and the task that serves it."""

    def __init__(self, token: str | None, namespaces: set[str] | None, method: str) -> None:
        self.token = token
        self.namespaces = namespaces
        self.method = method
        self.task = asyncio.current_task()
        self.refused: ChronoqError | None = None

    def end(self, refused: ChronoqError) -> None:
        if self.refused is None and self.task is not None:
            self.refused = refused
            self.task.cancel()


class OpenCalls:
    """The calls in flight under a reloadable token file, re-checked while any is open."""

    def __init__(self, tokens: Callable[[], TokenAuth], interval: float = REVOCATION_CHECK) -> None:
        self._tokens = tokens
        self._interval = interval
        self._calls: set[_OpenCall] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._checked: TokenAuth | None = None
        self.ended = 0  # calls ended because their token stopped passing

    def __len__(self) -> int:
        return len(self._calls)

    @contextlib.contextmanager
    def track(
        self, token: str | None, namespaces: set[str] | None, method: str
    ) -> Iterator[_OpenCall]:
        call = _OpenCall(token, namespaces, method)
        self._calls.add(call)
        if self._watcher is None or self._watcher.done():
            self._checked = self._tokens()
            self._watcher = asyncio.get_running_loop().create_task(
                self._watch(), name="chronoq-token-revocation"
            )
        try:
            yield call
        finally:
            self._calls.discard(call)

    async def _watch(self) -> None:
        while self._calls:
            await asyncio.sleep(self._interval)
            self.recheck()

    def recheck(self) -> None:
        """End the calls whose token no longer passes (after the token file changed)."""
        auth = self._tokens()
        if auth is self._checked:
            return
        self._checked = auth
        for call in list(self._calls):
            try:
                check_call(auth, call.token, call.namespaces, call.method)
            except ChronoqError as exc:
                log.info("auth: %s ended in flight: %s", call.method, exc.message)
                self.ended += 1
                call.end(exc)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuse chronoq calls without a known token (UNAUTHENTICATED) or outside its namespaces
    (PERMISSION_DENIED), and end calls in flight whose token is revoked."""

    def __init__(self, auth: TokenAuth | TokenFile, *, openings: Openings | None = None) -> None:
        self._tokens = auth.current if isinstance(auth, TokenFile) else lambda: auth
        # A fixed set of tokens never revokes one: nothing to track.
        self.open_calls = OpenCalls(auth.current) if isinstance(auth, TokenFile) else None
        #: Streams authenticated by their token, waiting for their first message: the node's
        #: one ``Openings``, shared with its worker service, so its caps hold for both.
        self.openings = Openings() if openings is None else openings

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(GUARDED_PREFIX):
            return handler
        token = bearer_token(
            _metadata_value(handler_call_details.invocation_metadata, "authorization")
        )
        if handler.stream_stream is not None:
            # A stream is checked on its first message (which names its namespace, as
            # ``WorkRequest.open`` does); nothing reaches the servicer before that.
            return grpc.stream_stream_rpc_method_handler(
                self._guard_stream(method, token, handler.stream_stream),  # type: ignore[arg-type]
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary is None:
            # Other streaming shapes are not guarded: refuse them (UNIMPLEMENTED) rather than
            # serve them unguarded.
            log.error("auth: %s is a streaming method, which the interceptor cannot guard", method)
            return None
        return grpc.unary_unary_rpc_method_handler(
            self._guard(method, token, handler.unary_unary),  # type: ignore[arg-type]
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _guard(self, method: str, token: str | None, behavior: Behavior) -> Behavior:
        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            namespaces = request_namespaces(request)
            await self._check(method, token, namespaces, context)
            return await self._tracked(
                method, token, namespaces, context, lambda: behavior(request, context)
            )

        return guarded

    def _guard_stream(self, method: str, token: str | None, behavior: Behavior) -> Behavior:
        async def guarded(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            # The token first, from the metadata: a stream without a valid one is refused
            # before it may hold anything while its first message is awaited.
            await self._check_token(method, token, context)
            try:
                first = await self.openings.first(requests, key=token or "")
            except ChronoqError as exc:
                await context.abort(code_for(exc), exc.message)
            # A stream closed before its first message names no namespace: checked as one
            # of the default namespace, so the servicer can say what is missing.
            namespaces = request_namespaces(first) if first is not None else {DEFAULT_NAMESPACE}
            await self._check(method, token, namespaces, context)

            opened = Opened(first, requests)  # the servicer's Openings passes it at once
            return await self._tracked(
                method, token, namespaces, context, lambda: behavior(opened, context)
            )

        return guarded

    async def _check_token(
        self, method: str, token: str | None, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        try:
            self._tokens().authenticate(token)
        except ChronoqError as exc:
            log.info("auth: %s refused from %s: %s", method, context.peer(), exc.message)
            await context.abort(code_for(exc), exc.message)

    async def _check(
        self,
        method: str,
        token: str | None,
        namespaces: set[str] | None,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        try:
            check_call(self._tokens(), token, namespaces, method)
        except ChronoqError as exc:
            log.info("auth: %s refused from %s: %s", method, context.peer(), exc.message)
            await context.abort(code_for(exc), exc.message)

    async def _tracked(
        self,
        method: str,
        token: str | None,
        namespaces: set[str] | None,
        context: grpc.aio.ServicerContext[Any, Any],
        serve: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Serve the call; with a token file, end it when its token stops passing."""
        if self.open_calls is None:
            return await serve()
        with self.open_calls.track(token, namespaces, method) as call:
            try:
                return await serve()
            except asyncio.CancelledError:
                if call.refused is None or call.task is None:
                    raise  # the caller went away, or the server stops
                call.task.uncancel()
                refused = call.refused
        message = (
            "bearer token revoked during the call"
            if isinstance(refused, Unauthenticated)
            else f"{refused.message} (the token file changed during the call)"
        )
        await context.abort(code_for(refused), message)


def api_security(
    *,
    auth_tokens: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    openings: Openings | None = None,
) -> tuple[list[grpc.aio.ServerInterceptor], grpc.ServerCredentials | None]:
    """A node's interceptors and server credentials from its settings: read (and checked) up
    front, so a bad token file or certificate stops the node before it binds anything. The token
    file is then watched: edits take effect within a second (see ``TokenFile``)."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if auth_tokens is not None:
        interceptors.append(AuthInterceptor(TokenFile(auth_tokens), openings=openings))
    return interceptors, tls.server_credentials(tls_cert, tls_key, tls_client_ca)
