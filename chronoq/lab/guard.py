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

from dataclasses import dataclass

from chronoq.origins import (
    JSON_CONTENT_TYPE,
    OWN_FETCH_SITES,
    OwnAddress,
    new_secret,
    same_secret,
    short,
    url_host,
)

__all__ = ["SECRET_HEADER", "LabGuard", "Request", "new_secret", "url_host"]

#: The header that carries the per-run secret on every API request.
SECRET_HEADER = "X-Chronoq-Lab"
#: Methods that change nothing; any other needs a JSON body.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The paths that need no secret: the page and its static files (everything else does).
PUBLIC_PATH = "/"
PUBLIC_PREFIX = "/static/"


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
            return f"Host {short(request.host)} is not this lab's address"
        if request.origin is not None and not self.origin_allowed(request.origin):
            return f"cross-origin request from {short(request.origin)}"
        if request.path == PUBLIC_PATH or request.path.startswith(PUBLIC_PREFIX):
            return None
        if request.fetch_site is not None and request.fetch_site not in OWN_FETCH_SITES:
            return f"cross-site request (Sec-Fetch-Site: {short(request.fetch_site)})"
        if not same_secret(request.secret, self.secret):
            return f"missing or wrong {SECRET_HEADER}: open the URL that chronoq lab printed"
        if request.method.upper() not in SAFE_METHODS and request.content_type != (
            JSON_CONTENT_TYPE
        ):
            return f"send Content-Type: {JSON_CONTENT_TYPE}"
        return None

    def host_allowed(self, netloc: str) -> bool:
        """Whether a ``Host`` header value (``host[:port]``) names this lab."""
        return OwnAddress(self.bound_host, self.port).host_allowed(netloc)

    def origin_allowed(self, origin: str) -> bool:
        """Whether an ``Origin`` header value is this lab's own origin (``http://host:port``)."""
        return OwnAddress(self.bound_host, self.port).origin_allowed(origin)
