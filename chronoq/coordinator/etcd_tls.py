"""An aetcd client that talks TLS (and mutual TLS) to etcd and keeps its auth token fresh.

aetcd 1.0's ``Client.connect`` always opens ``grpc.aio.insecure_channel``. ``EtcdClient``
repeats its steps (channel, optional ``Authenticate``, stubs, watcher) with a secure channel
when it is given credentials; everything else is aetcd's. A refused user name or password
comes back as ``UnauthenticatedError`` naming the user, not aetcd's bare INVALID_ARGUMENT.

aetcd authenticates once per connection, but etcd forgets its simple tokens when it restarts
(and after ``--auth-token-ttl`` of silence): from then on every call would fail with "invalid
auth token" for good. So with a user, channel interceptors put the current token on every call,
and a unary call refused for a stale token authenticates again and is retried once; streams
(watches, lease keepalives) pick up the new token when they are opened again. A watch opened
with a stale token is not refused but cancelled unseen ("permission denied"), so before it
opens, one cheap unary call (the user's own record) renews a stale token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc, watcher


class EtcdClient(aetcd.Client):  # type: ignore[misc]  # aetcd ships no type hints
    """``aetcd.Client`` plus ``credentials``: None keeps aetcd's plaintext channel."""

    _is_connecting: bool
    metadata: tuple[tuple[str, str], ...] | None

    def __init__(self, *, credentials: grpc.ChannelCredentials | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._credentials = credentials
        self._auth_lock = asyncio.Lock()
        self.reauthentications = 0

    async def connect(self) -> None:
        """Open the channel and authenticate (aetcd's steps, on a TLS channel if configured)."""
        if self._connected.is_set():
            return
        if self._is_connecting:  # another task is connecting: wait for it, as aetcd does
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            options = list(self._options.items())
            interceptors: list[grpc.aio.ClientInterceptor] = (
                [_FreshTokenUnary(self), _FreshTokenStream(self)]
                if self._username is not None else []
            )
            self.channel = (
                grpc.aio.secure_channel(
                    target, self._credentials, options=options, interceptors=interceptors
                )
                if self._credentials is not None
                else grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
            )
            if self._username is not None and self._password is not None:
                await self._authenticate()
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        except grpc.aio.AioRpcError as exc:
            await self._drop_channel()
            aetcd.exceptions._handle_exception(exc)  # aetcd's error types, as its connect does
        except BaseException:
            await self._drop_channel()
            raise
        finally:
            self._is_connecting = False

    async def _authenticate(self) -> None:
        self.auth_stub = rpc.AuthStub(self.channel)
        request = rpc.AuthenticateRequest(name=self._username, password=self._password)
        try:
            reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (
                grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
            ):
                raise
            raise aetcd.exceptions.UnauthenticatedError(
                f"etcd refused user {self._username!r}: {exc.details()}"
            ) from exc
        self.metadata = (("token", reply.token),)

    async def reauthenticate(self, stale: str | None) -> None:
        """Get a new token unless another call did since ``stale`` was sent."""
        async with self._auth_lock:
            if self.token() == stale:
                await self._authenticate()
                self.reauthentications += 1

    def token(self) -> str | None:
        return self.metadata[0][1] if self.metadata else None

    async def renew_stale_token(self) -> None:
        """Ask for our own user record: a stale token is renewed on the way (unary retry)."""
        try:
            await self.auth_stub.UserGet(
                rpc.AuthUserGetRequest(name=self._username),
                timeout=self._timeout,
                metadata=self.metadata,
            )
        except grpc.aio.AioRpcError:
            pass  # etcd unreachable or the password refused: the stream says so itself

    async def _drop_channel(self) -> None:
        """A failed connect leaves nothing open, so the next call starts afresh."""
        if self.channel is not None:
            await self.channel.close()
        self._init_channel_attrs()


def _with_token(
    details: grpc.aio.ClientCallDetails, token: str | None
) -> grpc.aio.ClientCallDetails:
    """``details`` with its ``token`` metadata (if it has one) replaced by ``token``."""
    metadata = list(details.metadata or ())
    if token is None or not any(key == "token" for key, _ in metadata):
        return details  # Authenticate itself, or a client without a user
    return grpc.aio.ClientCallDetails(
        method=details.method,
        timeout=details.timeout,
        metadata=grpc.aio.Metadata(
            *[(key, token if key == "token" else value) for key, value in metadata]
        ),
        credentials=details.credentials,
        wait_for_ready=details.wait_for_ready,
    )


_WATCH = "/etcdserverpb.Watch/Watch"


def _method(details: grpc.aio.ClientCallDetails) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


def _stale_token(exc: grpc.aio.AioRpcError) -> bool:
    return exc.code() is grpc.StatusCode.UNAUTHENTICATED and "invalid auth token" in (
        exc.details() or ""
    )


class _FreshTokenUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, client: EtcdClient) -> None:
        self._client = client

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        token = self._client.token()
        call = await continuation(_with_token(client_call_details, token), request)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if token is None or not _stale_token(exc):
                raise
            await self._client.reauthenticate(stale=token)
            fresh = _with_token(client_call_details, self._client.token())
            return await continuation(fresh, request)
        return call


class _FreshTokenStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, client: EtcdClient) -> None:
        self._client = client

    async def intercept_stream_stream(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: AsyncIterable[Any] | Iterable[Any],
    ) -> Any:
        if _method(client_call_details) == _WATCH and self._client.token() is not None:
            await self._client.renew_stale_token()
        return await continuation(
            _with_token(client_call_details, self._client.token()), request_iterator
        )
