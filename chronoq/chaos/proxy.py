"""Loopback TCP proxies that can blackhole: cut one node off from etcd or from PostgreSQL.

A node started with a proxy's address as its ``--etcd`` or ``--dsn`` talks through it. A cut
stops moving bytes both ways and leaves new connections hanging, without closing anything:
what a partitioned network does (packets vanish; no RST tells the node). A heal lets the held
bytes flow again, like TCP retransmission after a partition ends. All proxies of a run share
one asyncio loop in a daemon thread, so a busy harness loop does not slow the nodes' traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHUNK = 64 * 1024


class Blackhole:
    """One listener on 127.0.0.1 forwarding to ``upstream``; ``cut()`` and ``heal()``."""

    def __init__(self, hub: ProxyHub, upstream: tuple[str, int], name: str) -> None:
        self._hub = hub
        self.upstream = upstream
        self.name = name
        self.port = 0
        self.cut_now = False
        self._open: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        self._conns.add(writer)
        try:
            await self._open.wait()  # a new connection during a cut just hangs
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return  # upstream down (a killed etcd member): the client sees a close
            self._conns.add(up_writer)
            try:
                await asyncio.gather(
                    self._pipe(reader, up_writer), self._pipe(up_reader, writer)
                )
            finally:
                self._conns.discard(up_writer)
                _close(up_writer)
        finally:
            self._conns.discard(writer)
            _close(writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        try:
            while data := await reader.read(CHUNK):
                await self._open.wait()  # held, not dropped: delivered after the heal
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.write_eof()

    def cut(self) -> None:
        self.cut_now = True
        self._hub.call(self._set, False)

    def heal(self) -> None:
        self.cut_now = False
        self._hub.call(self._set, True)

    def _set(self, is_open: bool) -> None:
        assert self._open is not None
        if is_open:
            self._open.set()
        else:
            self._open.clear()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            _close(w)
        if self._open is not None:
            self._open.set()  # release held pipes so they see their closed sockets


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


class ProxyHub:
    """Owns the proxy thread and its loop; ``add()`` proxies, ``close()`` stops them all."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxies",
                                        daemon=True)
        self._thread.start()
        self.proxies: list[Blackhole] = []

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def call(self, fn: Any, *args: Any) -> None:
        self._loop.call_soon_threadsafe(fn, *args)

    def add(self, upstream: str, name: str) -> Blackhole:
        """A proxy to ``host:port``, listening on a free loopback port."""
        host, _, port = upstream.rpartition(":")
        proxy = Blackhole(self, (host, int(port)), name)
        self._run(proxy._start())
        self.proxies.append(proxy)
        return proxy

    def close(self) -> None:
        if not self._loop.is_running():
            return
        with contextlib.suppress(Exception):
            self._run(self._stop_all(), timeout=5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._loop.is_running():
            self._loop.close()

    async def _stop_all(self) -> None:
        for p in self.proxies:
            await p._stop()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
