"""The DSNs of an embedded PostgreSQL: through its private unix socket, or over TCP.

Pure: no I/O. The socket form names the directory in the query (``?host=/tmp/cqpg-...``),
since a unix socket path cannot be a URL host; the TCP form is for proxies put between a
node and the server (the chaos harness cuts nodes off that way).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit


def _tcp_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def server_dsn(
    user: str, secret: str | None, database: str, host: str, port: int, socket_dir: Path | None
) -> str:
    """The DSN of ``database`` as ``user`` (with ``secret``, unless None): through the socket
    in ``socket_dir``, or over TCP to ``host:port`` when it is None."""
    userinfo = f"{user}:{quote(secret, safe='')}" if secret is not None else user
    name = quote(database, safe="")
    if socket_dir is None:
        return f"postgresql://{userinfo}@{_tcp_host(host)}:{port}/{name}"
    socket = quote(str(socket_dir), safe="")
    return f"postgresql://{userinfo}@/{name}?host={socket}&port={port}"


def over_tcp(dsn: str, host: str, port: int) -> str:
    """``dsn`` (a socket one of ``server_dsn``'s) going to ``host:port`` over TCP instead."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port")]
    netloc = f"{parts.netloc.rpartition('@')[0]}@{_tcp_host(host)}:{port}"
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))
