"""Whether an HTTP request comes from a local web app's own page, for the lab and the console.

Both listen on an address of this machine and act with real power (killing nodes, or the
operator's token), while any site the user visits can make the browser send requests there
(a form POST needs no CORS permission) or rebind its own DNS name to the app's address. What
defends them is the same: the ``Host`` must name the app's own address and port (a rebound
name arrives with the attacker's host name), the ``Origin``, when sent, must be the app's own,
and secrets are compared in constant time.

Pure: the servers feed it header values.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: Random bytes in a secret (base64url: 32 characters, safe in a URL, a cookie, a header).
SECRET_BYTES = 24
#: The only content type of a state-changing request: no HTML form can send it.
JSON_CONTENT_TYPE = "application/json"
#: ``Sec-Fetch-Site`` values of an app's own requests (``none``: typed in the address bar).
OWN_FETCH_SITES = frozenset({"same-origin", "none"})
#: What a page of a local web app may load and run: its own files only. No inline script or
#: style (the pages keep both in static files), no plugins, no ``<base>`` or form sent
#: elsewhere, no framing by another page. Data is set as text by the scripts, so a name read
#: from etcd or a tenant's queue name cannot become markup, and if it ever did, no script of it
#: would run.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
#: Headers on every response of the lab and the console, errors and static files included.
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def with_headers(headers: Mapping[str, str]) -> Callable[[Any, Any], Awaitable[None]]:
    """An ``on_response_prepare`` hook (aiohttp's signal, taking the request and the response)
    that gives every response ``headers``: refusals, errors and static files included, so no
    page of the app runs other scripts or sits in another page's frame."""

    async def secure(_request: Any, response: Any) -> None:
        response.headers.update(headers)

    return secure


#: How much of a header value an error message repeats.
SHORT = 60
_LOOPBACK_NAMES = frozenset({"localhost"})
_MAX_PORT_DIGITS = 5
_HTTP_PORT = 80


def new_secret() -> str:
    """A fresh random secret."""
    return secrets.token_urlsafe(SECRET_BYTES)


def same_secret(given: str | None, secret: str) -> bool:
    """Whether ``given`` is ``secret``, compared in constant time."""
    return bool(given) and hmac.compare_digest((given or "").encode(), secret.encode())


def url_host(bound_host: str) -> str:
    """The host to put in the app's URL for a bound address (a wildcard: loopback)."""
    address = _ip(bound_host)
    if address is not None and address.is_unspecified:
        return "127.0.0.1" if address.version == 4 else "[::1]"
    return f"[{bound_host}]" if address is not None and address.version == 6 else bound_host


def short(value: str | None) -> str:
    """A header value fit for an error message: quoted, cut short."""
    if value is None:
        return "(none)"
    return repr(value if len(value) <= SHORT else value[:SHORT] + "…")


@dataclass(frozen=True)
class OwnAddress:
    """The address an app listens on, and which ``Host`` and ``Origin`` values name it.

    For a loopback bind the page may be opened as ``localhost``, ``127.0.0.1`` or ``[::1]`` on
    the app's port. For a wildcard (``0.0.0.0``, ``::``) any IP literal on its port: DNS
    rebinding needs a host *name*, so an address is never a rebound one; names other than
    ``localhost`` are refused. For a named host, that name.
    """

    bound_host: str
    port: int

    def host_allowed(self, netloc: str) -> bool:
        """Whether a ``Host`` header value (``host[:port]``) names this app."""
        host, port = split_netloc(netloc.strip().lower())
        if (port if port is not None else _HTTP_PORT) != self.port or not host:
            return False
        bound = _ip(self.bound_host)
        if host == self.bound_host.lower() or (bound is not None and _ip(host) == bound):
            return True
        if bound is not None and bound.is_loopback:
            address = _ip(host)
            return host in _LOOPBACK_NAMES or (address is not None and address.is_loopback)
        if bound is not None and bound.is_unspecified:
            return host in _LOOPBACK_NAMES or _ip(host) is not None
        return False

    def origin_allowed(self, origin: str) -> bool:
        """Whether an ``Origin`` header value is this app's own (``http://host:port``)."""
        scheme, sep, netloc = origin.strip().partition("://")
        return bool(sep) and scheme.lower() == "http" and self.host_allowed(netloc)


def split_netloc(netloc: str) -> tuple[str, int | None]:
    """``host:port`` (or ``[v6]:port``, either without a port) -> (host, port or None);
    ("", None) for what is neither."""
    if netloc.startswith("["):
        host, _, rest = netloc[1:].partition("]")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            return "", None
        port_text = rest[1:]
    else:
        host, sep, port_text = netloc.rpartition(":")
        if not sep:
            return netloc, None
    if not port_text.isdigit() or len(port_text) > _MAX_PORT_DIGITS:
        return "", None
    return host, int(port_text)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
