"""The client's nodes: one gRPC channel per address, each followed by its health stream.

A frozen node (SIGSTOP, a GC pause, a frozen VM, a black-holed network) keeps its TCP
connection open and answers nothing, so a call sent to it would hang until its deadline.
Keepalive pings with a short timeout close such a connection in about a second: the calls
in flight on it fail with UNAVAILABLE (and are retried elsewhere when that is safe), and its
health stream breaks, so the picker passes the node over until it answers SERVING again.
With one address there is nothing to choose from: no health stream is kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoq.api.v1 import cluster_pb2_grpc, schedules_pb2_grpc, tasks_pb2_grpc, worker_pb2_grpc
from chronoq.client.picker import NodeHealth, Picker

log = logging.getLogger("chronoq.client")

#: A keepalive ping every second on every channel, also between calls...
KEEPALIVE_TIME_MS = 1_000
#: ...and a node that has not answered one within a second is treated as gone. Nodes accept
#: pings this often (``MIN_CLIENT_PING_INTERVAL_MS`` in ``chronoq.node.node``).
KEEPALIVE_TIMEOUT_MS = 1_000
#: gRPC's reconnect backoff grows to two minutes by default; a node that comes back after an
#: outage should get calls again within seconds.
MAX_RECONNECT_BACKOFF_MS = 2_000
#: Pause before following a node's health again after its stream ended.
WATCH_RETRY_SECONDS = 1.0
#: Messages up to this size both ways (batches of submits and claims).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_HEALTH: dict[int, NodeHealth] = {
    health_pb2.HealthCheckResponse.SERVING: NodeHealth.SERVING,
    health_pb2.HealthCheckResponse.NOT_SERVING: NodeHealth.NOT_SERVING,
}


def channel_options() -> list[tuple[str, int | str]]:
    """Options of every client channel: large messages, fast detection of a silent node."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # Recent gRPC cores time a keepalive ping out by this one (default: a minute).
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        # Without this, gRPC stops pinging after two pings with no data (an idle stream).
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]


def open_channel(
    address: str, credentials: grpc.ChannelCredentials | None = None
) -> grpc.aio.Channel:
    """A client channel to one node with ``channel_options``: TLS when ``credentials`` is set."""
    options = channel_options()
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options)
    return grpc.aio.insecure_channel(address, options=options)


@dataclass(frozen=True)
class NodeStubs:
    """The service stubs of one node's channel."""

    address: str
    channel: grpc.aio.Channel
    tasks: Any
    workers: Any
    cluster: Any
    schedules: Any

    @classmethod
    def of(cls, address: str, channel: grpc.aio.Channel) -> NodeStubs:
        return cls(
            address,
            channel,
            tasks_pb2_grpc.TaskServiceStub(channel),  # type: ignore[no-untyped-call]
            worker_pb2_grpc.WorkerServiceStub(channel),  # type: ignore[no-untyped-call]
            cluster_pb2_grpc.ClusterServiceStub(channel),  # type: ignore[no-untyped-call]
            schedules_pb2_grpc.ScheduleServiceStub(channel),  # type: ignore[no-untyped-call]
        )


class NodePool:
    """The nodes of a client and the picker that chooses among them."""

    def __init__(self, channels: Sequence[tuple[str, grpc.aio.Channel]]) -> None:
        self.nodes = [NodeStubs.of(address, channel) for address, channel in channels]
        self.picker = Picker([n.address for n in self.nodes])
        self._watches: list[asyncio.Task[None]] = []
        self._closed = False

    def __len__(self) -> int:
        return len(self.nodes)

    def pick(self, avoid: Sequence[int] = ()) -> int:
        """The node for the next call (``avoid``: the ones this call already tried)."""
        self._follow_health()
        return self.picker.pick(_now(), avoid)

    def failed(self, index: int) -> None:
        self.picker.failed(index, _now())

    def answered(self, index: int) -> None:
        self.picker.answered(index)

    async def wait_ready(self) -> None:
        """Until any node's channel is connected."""
        waits = [asyncio.ensure_future(n.channel.channel_ready()) for n in self.nodes]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def close(self) -> None:
        self._closed = True
        for task in self._watches:
            task.cancel()
        await asyncio.gather(*self._watches, return_exceptions=True)
        self._watches = []
        for node in self.nodes:
            await node.channel.close()

    def _follow_health(self) -> None:
        """Start the health streams on first use (a client may be made outside a loop)."""
        if self._watches or self._closed or len(self.nodes) < 2:
            return
        self._watches = [
            asyncio.create_task(self._watch(i), name=f"chronoq-health-{n.address}")
            for i, n in enumerate(self.nodes)
        ]

    async def _watch(self, index: int) -> None:
        """Follow one node's ``grpc.health.v1`` status for as long as the pool lives."""
        node = self.nodes[index]
        stub = health_pb2_grpc.HealthStub(node.channel)
        while True:
            try:
                # wait_for_ready: while the node is down the stream waits for it to come back.
                call = stub.Watch(health_pb2.HealthCheckRequest(service=""), wait_for_ready=True)
                async for reply in call:
                    self._set(index, _HEALTH.get(reply.status, NodeHealth.UNKNOWN))
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    self._set(index, NodeHealth.UNKNOWN)
                    return  # a node without health checking: calls alone tell
                self._set(index, NodeHealth.UNREACHABLE)
            await asyncio.sleep(WATCH_RETRY_SECONDS)

    def _set(self, index: int, health: NodeHealth) -> None:
        view = self.picker.nodes[index]
        if view.health is health:
            return
        was = view.health
        self.picker.set_health(index, health)
        if health is NodeHealth.SERVING:
            self.picker.answered(index)
        if was is not NodeHealth.UNKNOWN or health is not NodeHealth.SERVING:
            log.info("node %s: %s (was %s)", view.address, health.name, was.name)


def _now() -> float:
    return asyncio.get_running_loop().time()
