"""What a node answered, as the chronoq error of its status code (client side)."""

from __future__ import annotations

import grpc

from chronoq import errors


def translate(exc: grpc.aio.AioRpcError) -> errors.RemoteError:
    """A gRPC error as the chronoq error of its status code."""
    code = exc.code()
    cls = errors.remote_error_class(code.name)
    return cls(f"{code.name}: {exc.details() or 'no details'}", code.name)
