"""A libpq password file for processes that reach several PostgreSQL servers.

One ``PGPASSWORD`` fits one server: asyncpg takes it for every connection without a
password of its own, before it looks at a password file. A node of a stack with several
store shards (each server with its own password) gets ``PGPASSFILE`` instead, naming this
file: one line per server, ``host:port:database:user:password``. Passwords stay out of the
command lines that every local account can read.

``passfile_text`` is pure; ``write_passfile`` writes it mode 0600 from its creation.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

#: The host a unix socket connection is matched with (asyncpg and libpq alike).
_SOCKET_HOST = "localhost"


def _escape(field: str) -> str:
    return field.replace("\\", "\\\\").replace(":", "\\:")


def passfile_lines(dsn: str, *, any_host: bool = False) -> list[str]:
    """The password file's lines for a URL DSN with a password (none without one): one per
    host of a multi-host DSN; a unix socket (``?host=/dir``) is matched as ``localhost``.
    ``any_host``: one line for every host and port (a server reached through a proxy)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return []
    user = unquote(parts.username or "")
    database = unquote(parts.path.lstrip("/")) or user
    password = unquote(parts.password)
    query = dict(parse_qsl(parts.query))
    hosts = parts.netloc.rpartition("@")[2]
    pairs: list[tuple[str, str]] = []
    if any_host:
        pairs.append(("*", "*"))
    elif hosts:
        for item in hosts.split(","):
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "5432")
            pairs.append((host.strip("[]") or _SOCKET_HOST, port or "5432"))
    else:
        host = query.get("host", "")
        pairs.append((_SOCKET_HOST if host.startswith("/") or not host else host,
                      query.get("port", "5432")))  # fmt: skip
    return [
        ":".join(_escape(f) for f in (host, port, database, user, password))
        for host, port in pairs
    ]


def passfile_text(dsns: Sequence[str], *, fallback: str | None = None) -> str:
    """The whole file for ``dsns`` (first match wins, as in libpq: their order is kept),
    then ``fallback``'s password for any other host and port."""
    lines = [line for dsn in dsns for line in passfile_lines(dsn)]
    if fallback is not None:
        lines += passfile_lines(fallback, any_host=True)
    return "".join(line + "\n" for line in lines)


def write_passfile(path: Path, dsns: Sequence[str], *, fallback: str | None = None) -> Path:
    """Write the password file of ``dsns`` to ``path`` (mode 0600, atomically); returns it."""
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(passfile_text(dsns, fallback=fallback))
    os.replace(partial, path)
    return path
