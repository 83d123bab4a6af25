"""Container health probe: exit 0 when the target answers, 1 when it does not.

A node (the image's default HEALTHCHECK) is healthy when its gRPC health service reports
SERVING for the whole server (service ""); a node that cannot hold its share of the partitions,
or is shutting down, reports NOT_SERVING and so shows as unhealthy. The lab is probed over
HTTP instead::

    python healthcheck.py                          # gRPC, 127.0.0.1:$CHRONOQ_PORT (7070)
    python healthcheck.py grpc 127.0.0.1:7070
    python healthcheck.py http http://127.0.0.1:8080/

``CHRONOQ_HEALTH_ADDRESS`` overrides the default gRPC target (a node bound to one interface).
Imports only what the image already has (grpcio, grpcio-health-checking, the standard library).
"""

from __future__ import annotations

import os
import sys
import urllib.request

TIMEOUT_S = 2.5  # below the HEALTHCHECK --timeout, so the probe reports instead of being killed


def probe_grpc(target: str) -> str | None:
    """None when the node's health service says SERVING, else why not."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return f"{target}: {exc.code().name}: {exc.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def probe_http(url: str) -> str | None:
    """None when the URL answers 2xx/3xx, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            status = int(response.status)
    except OSError as exc:  # URLError, HTTPError and timeouts are all OSErrors
        return f"{url}: {exc}"
    return None if status < 400 else f"{url}: HTTP {status}"


def main(argv: list[str]) -> int:
    kind = argv[0] if argv else "grpc"
    if kind == "grpc":
        default = os.environ.get("CHRONOQ_HEALTH_ADDRESS") or (
            f"127.0.0.1:{os.environ.get('CHRONOQ_PORT') or 7070}"
        )
        problem = probe_grpc(argv[1] if len(argv) > 1 else default)
    elif kind == "http":
        problem = probe_http(argv[1] if len(argv) > 1 else "http://127.0.0.1:8080/")
    else:
        print(
            f"usage: healthcheck.py [grpc [HOST:PORT] | http [URL]], not {kind!r}", file=sys.stderr
        )
        return 1  # docker reserves 2
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
