"""An aetcd client that can talk TLS (and mutual TLS) to etcd, and says why auth failed.

aetcd 1.0's ``Client.connect`` always opens ``grpc.aio.insecure_channel``. ``EtcdClient``
repeats its steps (channel, optional ``Authenticate``, stubs, watcher) with a secure channel
when it is given credentials; everything else is aetcd's. A refused user name or password
comes back as ``UnauthenticatedError`` naming the user, not aetcd's bare INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
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
            self.channel = (
                grpc.aio.secure_channel(target, self._credentials, options=options)
                if self._credentials is not None
                else grpc.aio.insecure_channel(target, options=options)
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

    async def _drop_channel(self) -> None:
        """A failed connect leaves nothing open, so the next call starts afresh."""
        if self.channel is not None:
            await self.channel.close()
        self._init_channel_attrs()
