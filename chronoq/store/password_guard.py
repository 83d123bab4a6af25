"""The driver never sends a password to a server it has not verified.

Whoever answers on a PostgreSQL address (another local account that took the port of a server
while it was down, a container on the same network) may ask for the password in clear
(``AuthenticationCleartextPassword``) or as an MD5 hash, and asyncpg answers both; it has no
equivalent of libpq's ``require_auth``. So every connection asyncpg makes in this process
goes through ``GuardedProtocol``: until the server says ``AuthenticationOk``, it reads each
authentication request before the driver does, and closes the connection on a cleartext or
MD5 request, and on an ``AuthenticationOk`` that no SCRAM exchange earned when it holds a
password (an impostor letting us in to feed us its own answers), unless the connection is TLS
with a verified server certificate (``sslmode=verify-ca`` or ``verify-full``). SCRAM-SHA-256
(what chronoq's own servers use) never reveals the password and proves the server knows it.
"""

from __future__ import annotations

import struct
from typing import Any

import asyncpg
import asyncpg.protocol
from asyncpg.connect_utils import SSLMode

#: Authentication request codes of the protocol (an 'R' message's first int32).
AUTH_OK = 0
AUTH_CLEARTEXT = 3
AUTH_MD5 = 5
AUTH_SASL_FINAL = 12
#: Pseudo-code: AuthenticationOk without a completed SCRAM exchange.
AUTH_UNEARNED_OK = -1
_REFUSED = {
    AUTH_CLEARTEXT: "asked for the password in clear",
    AUTH_MD5: "asked for the password as an MD5 hash",
    AUTH_UNEARNED_OK: "let us in without proving that it knows the password (no SCRAM)",
}
#: Bytes read before AuthenticationOk: a few small messages; more is not a PostgreSQL server.
MAX_STARTUP_BYTES = 64 * 1024
_HEADER = struct.Struct("!cI")


class PasswordRequestRefused(ConnectionError):
    """The server asked for the password in a form an impostor could read; not sent."""


class AuthWatch:
    """Reads the server's messages up to AuthenticationOk and names a refused request. Pure.

    ``feed`` takes the bytes received so far (the caller's buffer grows; already read complete
    messages are not read again).
    """

    def __init__(self, *, has_password: bool) -> None:
        # Without a password there is nothing to steal (peer or trust authentication).
        self.scram_done = not has_password
        self.done = False
        self._offset = 0

    def feed(self, buffer: bytes | bytearray) -> int | None:
        """The refused request among the complete messages not read yet, else None."""
        while not self.done and len(buffer) - self._offset >= _HEADER.size:
            kind, length = _HEADER.unpack_from(buffer, self._offset)
            end = self._offset + 1 + length
            if length < 4 or end > len(buffer):
                break
            code = None
            if kind == b"R" and length >= 8:
                code = int(struct.unpack_from("!I", buffer, self._offset + _HEADER.size)[0])
            self._offset = end
            if code in _REFUSED:
                return code
            if code == AUTH_SASL_FINAL:
                self.scram_done = True
            if code == AUTH_OK:
                self.done = True
                return None if self.scram_done else AUTH_UNEARNED_OK
        return None


class GuardedProtocol(asyncpg.protocol.Protocol):
    """asyncpg's protocol, reading the authentication requests first (see the module)."""

    def __init__(
        self, addr: Any, connected_fut: Any, con_params: Any, record_class: type, loop: Any
    ) -> None:
        super().__init__(addr, connected_fut, con_params, record_class, loop)
        self._guard_waiter = connected_fut
        self._guard_buffer: bytearray | None = bytearray()
        self._guard_watch = AuthWatch(has_password=bool(getattr(con_params, "password", None)))
        self._guard_where = addr
        verified = getattr(con_params, "sslmode", None) in (SSLMode.verify_ca, SSLMode.verify_full)
        self._guard_tls_verified = verified
        self._guard_transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self._guard_transport = transport
        super().connection_made(transport)

    def data_received(self, data: object) -> None:
        buffer = self._guard_buffer
        if buffer is not None:
            assert isinstance(data, bytes | bytearray | memoryview)
            buffer += data
            code = self._guard_watch.feed(buffer)
            if code is not None and not self._trusted():
                self._refuse(
                    f"the server at {self._guard_where} {_REFUSED[code]}; connection closed, "
                    "password not sent: it may be an impostor on that address (chronoq's "
                    "embedded servers use SCRAM; for another server use scram-sha-256, or TLS "
                    "with sslmode=verify-full)"
                )
                return
            if self._guard_watch.done or code is not None:
                self._guard_buffer = None
            elif len(buffer) > MAX_STARTUP_BYTES:
                self._refuse(
                    f"the server at {self._guard_where} sent over {MAX_STARTUP_BYTES} bytes "
                    "before authenticating; not a PostgreSQL server"
                )
                return
        super().data_received(data)

    def _trusted(self) -> bool:
        transport = self._guard_transport
        tls = transport is not None and transport.get_extra_info("ssl_object") is not None
        return bool(tls and self._guard_tls_verified)

    def _refuse(self, message: str) -> None:
        self._guard_buffer = None
        if not self._guard_waiter.done():
            self._guard_waiter.set_exception(PasswordRequestRefused(message))
        if self._guard_transport is not None:
            self._guard_transport.abort()


def install() -> None:
    """Make every asyncpg connection of this process use ``GuardedProtocol`` (idempotent)."""
    if asyncpg.protocol.Protocol is not GuardedProtocol:
        asyncpg.protocol.Protocol = GuardedProtocol  # type: ignore[misc,assignment]
