"""Loopback TCP proxies that can blackhole or degrade a link: cut one node off from etcd or
from PostgreSQL, or make its links slow and lossy.

A node started with a proxy's address as its ``--etcd`` or ``--dsn`` talks through it. A cut
stops moving bytes both ways and leaves new connections hanging, without closing anything:
what a partitioned network does (packets vanish; no RST tells the node). A heal lets the held
bytes flow again, like TCP retransmission after a partition ends. A shape (``shaping.py``)
delays each chunk by a jittered latency behind a bandwidth cap, and resets connections at
random (an RST: the node sees ECONNRESET). All proxies of a run share one asyncio loop in a
daemon thread, so a busy harness loop does not slow the nodes' traffic.

Bounds: each direction of a connection holds at most ``IN_FLIGHT_CHUNKS`` chunks of at most
``CHUNK`` bytes (``IN_FLIGHT_BYTES``); past that the proxy stops reading, and TCP's flow
control slows the sender. Every write has a deadline (``WRITE_DEADLINE_S``): a peer that
does not read for that long has its connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from chronoq.chaos.shaping import LinkShape, Shaper, lifetime

T = TypeVar("T")

CHUNK = 64 * 1024
#: Chunks waiting for their delivery time, per direction of a connection.
IN_FLIGHT_CHUNKS = 16
IN_FLIGHT_BYTES = CHUNK * IN_FLIGHT_CHUNKS
#: Longest a write may wait for its peer to read: longer than any freeze the harness holds,
#: so only a peer that is truly gone is cut loose.
WRITE_DEADLINE_S = 30.0

_Item = tuple[float, bytes] | None  # (deliver at, bytes), or None: end of stream


class _Conn:
    """One proxied connection: its two sockets' writers and, while shaped, a shaper per
    direction and the pending reset."""

    def __init__(self, number: int, down: asyncio.StreamWriter) -> None:
        self.number = number
        self.writers = [down]
        self.shapers: list[Shaper] | None = None
        self.reset_handle: asyncio.TimerHandle | None = None

    def reset(self) -> None:
        """Abort both sockets with an RST (SO_LINGER 0), as a lossy link's reset does."""
        for w in self.writers:
            sock = w.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(Exception):
                w.transport.abort()


class Blackhole:
    """One listener on 127.0.0.1 forwarding to ``upstream``; ``cut()`` and ``heal()``."""

    def __init__(self, hub: ProxyHub, upstream: tuple[str, int], name: str) -> None:
        self._hub = hub
        self.upstream = upstream
        self.name = name
        self.port = 0
        self.cut_now = False
        self.shape_now: LinkShape | None = None
        self.resets = 0  # connections this proxy reset (while shaped)
        self._seed = 0
        self._open: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._live: set[_Conn] = set()
        self._numbers = itertools.count()

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
            conn = _Conn(next(self._numbers), writer)
            conn.writers.append(up_writer)
            self._live.add(conn)
            self._arm(conn)
            try:
                await asyncio.gather(
                    self._pipe(reader, up_writer, conn, 0), self._pipe(up_reader, writer, conn, 1)
                )
            finally:
                self._disarm(conn)
                self._live.discard(conn)
                self._conns.discard(up_writer)
                _close(up_writer)
        finally:
            self._conns.discard(writer)
            _close(writer)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn, side: int
    ) -> None:
        """Read one direction; queue each chunk with its delivery time for ``_send``."""
        assert self._open is not None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Item] = asyncio.Queue(IN_FLIGHT_CHUNKS)
        sender = asyncio.create_task(self._send(queue, writer, conn))
        try:
            while data := await reader.read(CHUNK):
                await self._open.wait()  # held, not dropped: delivered after the heal
                shapers = conn.shapers
                at = shapers[side].delivery(loop.time(), len(data)) if shapers else 0.0
                await _put(queue, (at, data), sender)
            await _put(queue, None, sender)
            await sender
        except (ConnectionError, OSError):
            # The peer reset (a killed server): the other side must learn it at once, or a
            # statement in flight waits for its timeout on a connection nobody answers.
            conn.reset()
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender

    async def _send(self, queue: asyncio.Queue[_Item], writer: asyncio.StreamWriter,
                    conn: _Conn) -> None:
        """Write each chunk at its delivery time, each write under ``WRITE_DEADLINE_S``."""
        assert self._open is not None
        loop = asyncio.get_running_loop()
        try:
            while (item := await queue.get()) is not None:
                at, data = item
                if (delay := at - loop.time()) > 0:
                    await asyncio.sleep(delay)
                await self._open.wait()
                writer.write(data)
                async with asyncio.timeout(WRITE_DEADLINE_S):
                    await writer.drain()
            with contextlib.suppress(Exception):
                writer.write_eof()
        except (ConnectionError, OSError, TimeoutError):
            conn.reset()  # a peer gone or not reading: the whole connection goes

    # ------------------------------------------------------------------ shaping

    def _arm(self, conn: _Conn) -> None:
        """Give ``conn`` the current shape: its shapers and its reset time."""
        shape = self.shape_now
        if shape is None:
            return
        rng = random.Random(f"{self._seed}/{self.name}/{conn.number}")
        conn.shapers = [Shaper(shape, rng), Shaper(shape, rng)]
        life = lifetime(shape, rng)
        if life is not None:
            conn.reset_handle = asyncio.get_running_loop().call_later(life, self._reset, conn)

    def _disarm(self, conn: _Conn) -> None:
        conn.shapers = None
        if conn.reset_handle is not None:
            conn.reset_handle.cancel()
            conn.reset_handle = None

    def _reset(self, conn: _Conn) -> None:
        conn.reset_handle = None
        if conn in self._live:
            self.resets += 1
            conn.reset()

    def _set_shape(self, shape: LinkShape | None, seed: int) -> None:
        self.shape_now, self._seed = shape, seed
        for conn in list(self._live):
            self._disarm(conn)
            self._arm(conn)

    def shape(self, shape: LinkShape, seed: int = 0) -> None:
        """Make the link slow and lossy (for new and open connections) until ``unshape``."""
        self._hub.call(self._set_shape, shape, seed)

    def unshape(self) -> None:
        """Back to a clean link; chunks already delayed still arrive at their time."""
        self._hub.call(self._set_shape, None, 0)

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


async def _put(queue: asyncio.Queue[_Item], item: _Item, sender: asyncio.Task[None]) -> None:
    """``queue.put``, unless the sender that empties the queue has ended (then it never
    would): the connection is gone."""
    if sender.done():
        raise ConnectionResetError("the other side of the proxy closed")
    if not queue.full():
        queue.put_nowait(item)
        return
    put = asyncio.ensure_future(queue.put(item))
    await asyncio.wait({put, sender}, return_when=asyncio.FIRST_COMPLETED)
    if not put.done():
        put.cancel()
        raise ConnectionResetError("the other side of the proxy closed")


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
