"""Whoever answers on PostgreSQL's address never gets the password (issue 23).

The impostor is a small server speaking just enough of the startup protocol to ask for the
password the way an attacker would; it records every byte it receives.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import StoreUnavailable
from chronoq.store import Store

_SSL_REQUEST = struct.pack("!I", 80877103)
PASSWORD = "the-secret-password-1234"


@dataclass
class Impostor:
    """Answers every startup with one authentication request (``R`` + code)."""

    code: int
    host: str = "127.0.0.1"
    port: int = 0
    received: bytearray = field(default_factory=bytearray)
    connections: int = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for _ in range(3):  # an SSLRequest (answered "no"), then the startup message
                (length,) = struct.unpack("!I", await reader.readexactly(4))
                body = await reader.readexactly(min(length, 10_000) - 4)
                self.received += body
                if body[:4] != _SSL_REQUEST:
                    break
                writer.write(b"N")
            writer.write(b"R" + struct.pack("!II", 8, self.code))
            await writer.drain()
            while chunk := await asyncio.wait_for(reader.read(4096), 5):
                self.received += chunk
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Impostor]:
        server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            await server.wait_closed()


@pytest.mark.parametrize(("code", "what"), [(3, "in clear"), (5, "MD5"), (0, "without")])
async def test_an_impostor_asking_for_the_password_gets_nothing(code: int, what: str) -> None:
    """Cleartext (3), MD5 (5), or AuthenticationOk at once (0): the store refuses all."""
    async with Impostor(code).running() as impostor:
        dsn = f"postgresql://chronoq:{PASSWORD}@127.0.0.1:{impostor.port}/chronoq"
        with pytest.raises(StoreUnavailable, match=what):
            await Store.connect(dsn, min_size=1, max_size=1)
        await asyncio.sleep(0.1)  # anything in flight reaches the impostor
    assert impostor.connections >= 1
    assert b"chronoq" in impostor.received  # it saw the startup message ...
    assert PASSWORD.encode() not in impostor.received  # ... never the password
    assert b"p\x00" not in impostor.received[-64:]  # no PasswordMessage of any kind


async def test_the_embedded_store_never_reaches_an_impostor_on_its_port(tmp_path: Path) -> None:
    """The finding's attack: while the server is down, another account takes its TCP port.
    The nodes' DSN goes through the unix socket in a private directory: they wait for the
    real server and never talk to the impostor."""
    pg = EmbeddedPostgres(tmp_path / "pg", durable=False)
    pg.start()
    try:
        dsn = pg.create_database("chronoq")
        assert "host=%2Ftmp%2Fcqpg-" in dsn and "127.0.0.1" not in dsn
        assert pg.socket_dir.stat().st_mode & 0o777 == 0o700
        store = await Store.connect(dsn, min_size=0, max_size=1)
        try:
            pg.kill()
            async with Impostor(3, port=pg.port).running() as impostor:
                assert not await store.probe(timeout=2)
                with pytest.raises(StoreUnavailable):
                    await Store.connect(dsn, min_size=1, max_size=1)
            assert impostor.connections == 0
            assert pg.app_password.encode() not in impostor.received
            pg.start()
            assert await store.probe(timeout=5)
        finally:
            await store.close()
    finally:
        pg.stop()


async def test_a_real_server_over_tcp_still_takes_the_store(postgres: EmbeddedPostgres) -> None:
    """The guard lets SCRAM through: the TCP DSN (what the chaos proxies carry) works."""
    name = "tcp_guard_ok"
    postgres.create_database(name)
    try:
        store = await Store.connect(postgres.dsn_for(name, tcp=True), min_size=1, max_size=1)
        await store.close()
    finally:
        postgres.drop_database(name)
