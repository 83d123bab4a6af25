"""The chaos proxies on loopback: a shaped link delays and resets for real, a cut still holds
bytes until the heal, and a peer that never reads is cut loose at the write deadline instead
of holding the proxy's buffers forever."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator

import pytest

from chronoq.chaos import proxy as proxy_module
from chronoq.chaos.proxy import ProxyHub
from chronoq.chaos.shaping import LinkShape

pytestmark = pytest.mark.timeout(60)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def _round_trip(address: str, payload: bytes = b"ping") -> float:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        started = time.monotonic()
        writer.write(payload)
        await writer.drain()
        got = await asyncio.wait_for(reader.readexactly(len(payload)), 20)
        assert got == payload
        return time.monotonic() - started
    finally:
        writer.close()


async def test_a_slow_link_delays_both_ways_and_a_clean_one_again_does_not(
    hub: ProxyHub, echo: str
) -> None:
    p = hub.add(echo, "test->echo")
    p.shape(LinkShape(latency_s=0.15, jitter_s=0.0, mean_life_s=None))
    await asyncio.sleep(0.05)  # the shape is set on the proxies' loop
    assert await _round_trip(p.address) >= 0.3  # 150 ms each way
    p.unshape()
    await asyncio.sleep(0.05)
    assert await _round_trip(p.address) < 0.3


async def test_the_bandwidth_cap_holds_a_large_write_back(hub: ProxyHub, echo: str) -> None:
    p = hub.add(echo, "test->echo")
    p.shape(LinkShape(latency_s=0.0, jitter_s=0.0, bandwidth_bps=200_000, mean_life_s=None))
    await asyncio.sleep(0.05)
    # 100 kB each way at 200 kB/s: at least 0.5 s, however fast the machine.
    assert await _round_trip(p.address, b"x" * 100_000) >= 0.5


async def test_a_lossy_link_resets_connections(hub: ProxyHub, echo: str) -> None:
    p = hub.add(echo, "test->echo")
    p.shape(LinkShape(latency_s=0.0, jitter_s=0.0, mean_life_s=0.05), seed=1)
    await asyncio.sleep(0.05)
    host, _, port = p.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            for _ in range(200):  # bounded: the reset comes within a few tenths of a second
                writer.write(b"ping")
                await writer.drain()
                await asyncio.wait_for(reader.readexactly(4), 5)
                await asyncio.sleep(0.05)
    finally:
        writer.close()
    assert p.resets >= 1


async def test_a_cut_holds_bytes_until_the_heal(hub: ProxyHub, echo: str) -> None:
    p = hub.add(echo, "test->echo")
    host, _, port = p.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"a")
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(1), 5) == b"a"
        p.cut()
        await asyncio.sleep(0.05)
        writer.write(b"b")
        await writer.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(1), 0.5)
        p.heal()
        assert await asyncio.wait_for(reader.readexactly(1), 5) == b"b"  # held, not dropped
    finally:
        writer.close()


async def test_a_peer_that_never_reads_is_cut_loose_at_the_write_deadline(
    hub: ProxyHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proxy_module, "WRITE_DEADLINE_S", 0.5)
    closed = asyncio.Event()
    sent = 0

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        chunk = b"x" * 65536
        try:
            for _ in range(4096):  # bounded: 256 MiB at most, far past every buffer
                writer.write(chunk)
                # Longer than the test waits: only the proxy's deadline ends this in time.
                await asyncio.wait_for(writer.drain(), 45)
                sent += len(chunk)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            closed.set()
            writer.close()

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    try:
        p = hub.add(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", "test->flood")
        host, _, port = p.address.rpartition(":")
        _reader, writer = await asyncio.open_connection(host, int(port))  # never reads
        try:
            await asyncio.wait_for(closed.wait(), 20)
        finally:
            writer.close()
        # It stopped at the kernel's buffers plus the proxy's bounded queue, not at 256 MiB.
        assert sent < 4096 * 65536
    finally:
        server.close()


async def test_a_reset_from_upstream_reaches_the_client_at_once(hub: ProxyHub) -> None:
    """A server killed mid-request resets its sockets: the client behind the proxy must see
    the connection end, not wait on it for a reply that never comes."""

    async def die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the request arrived; now the server dies (RST)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(die, "127.0.0.1", 0)
    try:
        p = hub.add(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", "test->dies")
        host, _, port = p.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"q")
            await writer.drain()
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(reader.read(10), 5) == b""  # ended, not hung
        finally:
            writer.close()
    finally:
        server.close()
