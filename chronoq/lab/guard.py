"""Who may drive the lab: a web page elsewhere in the user's browser must not.

The lab listens on loopback, but any site the user visits can make the browser send requests
there (a form POST needs no CORS permission) or rebind its own DNS name to 127.0.0.1 and read
the answers. So every request is checked, and refused with 403 and a short reason unless:

- its ``Host`` is the lab's own address and port (a rebound name arrives with the attacker's
  host name);
- its ``Origin``, when the browser sends one, is the lab's own origin;
- unless it asks for the page or its static files, it carries the per-run secret in the
  ``X-Chronoq-Lab`` header. The page reads the secret from its URL fragment, which the
  browser never sends anywhere, and a custom header cannot be sent cross-origin without a
  CORS preflight the lab never answers;
- a state-changing request (POST ...) says ``Content-Type: application/json``, which no
  HTML form can send.

Pure: the aiohttp server feeds it the request's method, path and headers.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass

#: The header that carries the per-run secret on every API request.
SECRET_HEADER = "X-Chronoq-Lab"
#: Random bytes in the secret (base64url: 32 characters).
SECRET_BYTES = 24
#: Methods that change nothing; any other needs a JSON body.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The only content type of a state-changing request.
JSON_CONTENT_TYPE = "application/json"
#: The paths that need no secret: the page and its static files (everything else does).
PUBLIC_PATH = "/"
PUBLIC_PREFIX = "/static/"
#: ``Sec-Fetch-Site`` values of the lab's own requests (``none``: typed in the address bar).
OWN_FETCH_SITES = frozenset({"same-origin", "none"})
_LOOPBACK_NAMES = frozenset({"localhost"})


def new_secret() -> str:
    """A fresh per-run secret, safe in a URL fragment and a header."""
    return secrets.token_urlsafe(SECRET_BYTES)


def url_host(bound_host: str) -> str:
    """The host to put in the lab's URL for a bound address (a wildcard: loopback)."""
    address = _ip(bound_host)
    if address is not None and address.is_unspecified:
        return "127.0.0.1" if address.version == 4 else "[::1]"
    return f"[{bound_host}]" if address is not None and address.version == 6 else bound_host


@dataclass(frozen=True, kw_only=True)
class Request:
    """What the guard looks at in one HTTP request (header values None when absent)."""

    method: str
    path: str
    host: str | None
    origin: str | None = None
    content_type: str | None = None  # the media type only, without parameters
    secret: str | None = None
    fetch_site: str | None = None


@dataclass(frozen=True, kw_only=True)
class LabGuard:
    """The checks for one lab server: its secret and the address it listens on.

    ``bound_host`` is the address the server binds. For a loopback address the page may be
    opened as ``localhost``, ``127.0.0.1`` or ``[::1]`` on the lab's port. For a wildcard
    (``0.0.0.0``, ``::``) any IP literal on the lab's port is accepted: DNS rebinding needs a
    host *name*, so an address is never a rebound one; names other than ``localhost`` are
    refused.
    """

    secret: str
    bound_host: str
    port: int

    def refusal(self, request: Request) -> str | None:
        """Why ``request`` is refused, or None when it may go on."""
        if request.host is None or not self.host_allowed(request.host):
            return f"Host {_short(request.host)} is not this lab's address"
        if request.origin is not None and not self.origin_allowed(request.origin):
            return f"cross-origin request from {_short(request.origin)}"
        if request.path == PUBLIC_PATH or request.path.startswith(PUBLIC_PREFIX):
            return None
        if request.fetch_site is not None and request.fetch_site not in OWN_FETCH_SITES:
            return f"cross-site request (Sec-Fetch-Site: {_short(request.fetch_site)})"
        if not request.secret or not hmac.compare_digest(
            request.secret.encode(), self.secret.encode()
        ):
            return f"missing or wrong {SECRET_HEADER}: open the URL that chronoq lab printed"
        if request.method.upper() not in SAFE_METHODS and request.content_type != (
            JSON_CONTENT_TYPE
        ):
            return f"send Content-Type: {JSON_CONTENT_TYPE}"
        return None

    def host_allowed(self, netloc: str) -> bool:
        """Whether a ``Host`` header value (``host[:port]``) names this lab."""
        host, port = _split_netloc(netloc.strip().lower())
        if port is None:
            port = 80
        if port != self.port or not host:
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
        """Whether an ``Origin`` header value is this lab's own origin (``http://host:port``)."""
        scheme, sep, netloc = origin.strip().partition("://")
        return bool(sep) and scheme.lower() == "http" and self.host_allowed(netloc)


def _split_netloc(netloc: str) -> tuple[str, int | None]:
    """``host:port`` (or ``[v6]:port``, either without a port) -> (host, port or None)."""
    if netloc.startswith("["):
        host, _, rest = netloc[1:].partition("]")
        port_text = rest.removeprefix(":") if rest.startswith(":") else None
        if rest and port_text is None:
            return "", None
    else:
        host, sep, port_text_raw = netloc.rpartition(":")
        if not sep:
            host, port_text = netloc, None
        else:
            port_text = port_text_raw
    if port_text is None:
        return host, None
    if not port_text.isdigit() or len(port_text) > 5:
        return "", None
    return host, int(port_text)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _short(value: str | None, limit: int = 60) -> str:
    """A header value fit for an error message: quoted, cut short."""
    if value is None:
        return "(none)"
    return repr(value if len(value) <= limit else value[:limit] + "…")
