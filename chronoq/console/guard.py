"""Who may use the console, and which requests may change something.

The console acts with the operator's bearer token, so whoever reaches it acts as the operator.
Every request is checked, and refused with a short reason unless:

- its ``Host`` is the console's own address and port (a DNS-rebound name arrives with the
  attacker's host name);
- its ``Origin``, when the browser sends one, is the console's own origin, and its
  ``Sec-Fetch-Site``, when sent, is ``same-origin`` (or ``none``: typed in the address bar);
- unless it asks for the login link or a static file, it carries the session cookie that the
  login link (the URL ``chronoq console`` prints) set;
- a state-changing request (POST) says ``Content-Type: application/json``, which no HTML form
  can send, and carries the page's CSRF token in ``X-CSRF-Token``, which a page elsewhere
  cannot read.

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

__all__ = [
    "CSRF_HEADER",
    "LOGIN_PATH",
    "SESSION_COOKIE",
    "STATIC_PREFIX",
    "ConsoleGuard",
    "Refusal",
    "Request",
    "new_secret",
    "url_host",
]

#: The session cookie set by the login link.
SESSION_COOKIE = "chronoq_console"
#: The header that carries the page's CSRF token on every state-changing request.
CSRF_HEADER = "X-CSRF-Token"
#: Methods that change nothing; any other needs JSON and the CSRF token.
SAFE_METHODS = frozenset({"GET", "HEAD"})
#: Paths that need no session: the login link and the static files.
LOGIN_PATH = "/login"
STATIC_PREFIX = "/static/"


@dataclass(frozen=True, kw_only=True)
class Request:
    """What the guard looks at in one HTTP request (header values None when absent)."""

    method: str
    path: str
    host: str | None
    origin: str | None = None
    fetch_site: str | None = None
    content_type: str | None = None  # the media type only, without parameters
    session: str | None = None  # the session cookie's value
    csrf: str | None = None  # the CSRF header's value


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, and the HTTP status that says so."""

    status: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class ConsoleGuard:
    """The checks of one console server: its secrets and the address it listens on.

    For a loopback bind the console may be opened as ``localhost``, ``127.0.0.1`` or
    ``[::1]`` on its port; for a wildcard (``0.0.0.0``, ``::``) any IP literal on its port
    (rebinding needs a host *name*); for a named host, that name.
    """

    session_key: str
    csrf_token: str
    bound_host: str
    port: int

    def refusal(self, request: Request) -> Refusal | None:
        """Why ``request`` is refused, or None when it may go on."""
        if request.host is None or not self.host_allowed(request.host):
            return Refusal(403, f"Host {short(request.host)} is not this console's address")
        if request.origin is not None and not self.origin_allowed(request.origin):
            return Refusal(403, f"cross-origin request from {short(request.origin)}")
        if request.path == LOGIN_PATH or request.path.startswith(STATIC_PREFIX):
            return None
        if not same_secret(request.session, self.session_key):
            return Refusal(401, "no console session: open the URL that chronoq console printed")
        if request.method.upper() in SAFE_METHODS:
            return None
        if request.fetch_site is not None and request.fetch_site not in OWN_FETCH_SITES:
            site = short(request.fetch_site)
            return Refusal(403, f"cross-site request (Sec-Fetch-Site: {site})")
        if request.content_type != JSON_CONTENT_TYPE:
            return Refusal(415, f"send Content-Type: {JSON_CONTENT_TYPE}")
        if not same_secret(request.csrf, self.csrf_token):
            return Refusal(403, f"missing or wrong {CSRF_HEADER}: reload the page")
        return None

    def key_matches(self, key: str | None) -> bool:
        """Whether a login link's key is this console's session key."""
        return same_secret(key, self.session_key)

    def host_allowed(self, netloc: str) -> bool:
        """Whether a ``Host`` header value (``host[:port]``) names this console."""
        return OwnAddress(self.bound_host, self.port).host_allowed(netloc)

    def origin_allowed(self, origin: str) -> bool:
        """Whether an ``Origin`` header value is this console's own (``http://host:port``)."""
        return OwnAddress(self.bound_host, self.port).origin_allowed(origin)
