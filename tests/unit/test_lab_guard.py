"""The lab's request checks, as a table of requests (no server)."""

from __future__ import annotations

import pytest

from chronoq.lab.guard import LabGuard, Request, new_secret, url_host

SECRET = "s" * 32
LOOPBACK = LabGuard(secret=SECRET, bound_host="127.0.0.1", port=8080)


def api(**fields: str | None) -> Request:
    """A request of the lab's own page (every defence satisfied), with ``fields`` changed."""
    base: dict[str, str | None] = {
        "method": "POST",
        "path": "/api/kill",
        "host": "127.0.0.1:8080",
        "origin": "http://127.0.0.1:8080",
        "content_type": "application/json",
        "secret": SECRET,
        "fetch_site": "same-origin",
    }
    return Request(**{**base, **fields})  # type: ignore[arg-type]


def test_the_pages_own_requests_pass() -> None:
    assert LOOPBACK.refusal(api()) is None
    assert LOOPBACK.refusal(api(method="GET", path="/api/state", content_type=None)) is None
    assert LOOPBACK.refusal(api(origin=None, fetch_site=None)) is None  # older browsers, curl
    assert LOOPBACK.refusal(api(host="localhost:8080", origin="http://localhost:8080")) is None
    # The page and its files need no secret (the fragment never reaches the server).
    assert LOOPBACK.refusal(Request(method="GET", path="/", host="127.0.0.1:8080")) is None
    assert (
        LOOPBACK.refusal(
            Request(method="GET", path="/static/lab.js", host="localhost:8080", fetch_site="none")
        )
        is None
    )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"path": "//api/kill", "secret": None}, "X-Chronoq-Lab"),  # not public: needs the key
        ({"path": "/api", "secret": None}, "X-Chronoq-Lab"),
        ({"host": "evil.example:8080"}, "not this lab's address"),
        ({"host": "127.0.0.1:8081"}, "not this lab's address"),
        ({"host": "127.0.0.1"}, "not this lab's address"),  # port 80 implied
        ({"host": None}, "not this lab's address"),
        ({"host": "127.0.0.1:80a"}, "not this lab's address"),
        ({"origin": "http://evil.example"}, "cross-origin"),
        ({"origin": "https://127.0.0.1:8080"}, "cross-origin"),
        ({"origin": "null"}, "cross-origin"),
        ({"fetch_site": "cross-site"}, "cross-site"),
        ({"fetch_site": "same-site"}, "cross-site"),
        ({"secret": None}, "X-Chronoq-Lab"),
        ({"secret": "s" * 31}, "X-Chronoq-Lab"),
        ({"content_type": "text/plain"}, "Content-Type: application/json"),
        ({"content_type": "application/x-www-form-urlencoded"}, "Content-Type"),
        ({"content_type": None}, "Content-Type"),
        ({"method": "DELETE", "content_type": None}, "Content-Type"),
    ],
)
def test_what_another_page_could_send_is_refused(
    fields: dict[str, str | None], reason: str
) -> None:
    got = LOOPBACK.refusal(api(**fields))
    assert got is not None and reason in got


def test_the_reason_cuts_a_long_header_short() -> None:
    got = LOOPBACK.refusal(api(host="x" * 10_000))
    assert got is not None and len(got) < 120


@pytest.mark.parametrize(
    ("bound", "host", "ok"),
    [
        ("127.0.0.1", "127.0.0.1:8080", True),
        ("127.0.0.1", "LOCALHOST:8080", True),
        ("127.0.0.1", "[::1]:8080", True),
        ("127.0.0.1", "127.0.0.2:8080", True),  # all of 127/8 is this machine
        ("127.0.0.1", "192.168.1.5:8080", False),
        ("127.0.0.1", "localhost.evil.example:8080", False),
        ("::1", "[::1]:8080", True),
        ("::1", "[::1]", False),
        ("::1", "[::1:8080", False),
        ("0.0.0.0", "192.168.1.5:8080", True),  # an address cannot be a rebound name
        ("0.0.0.0", "laptop.local:8080", False),
        ("192.168.1.5", "192.168.1.5:8080", True),
        ("192.168.1.5", "localhost:8080", False),
    ],
)
def test_hosts(bound: str, host: str, ok: bool) -> None:
    assert LabGuard(secret=SECRET, bound_host=bound, port=8080).host_allowed(host) is ok


def test_port_80_may_be_left_out() -> None:
    guard = LabGuard(secret=SECRET, bound_host="127.0.0.1", port=80)
    assert guard.host_allowed("127.0.0.1") and guard.origin_allowed("http://localhost")


def test_urls_and_secrets() -> None:
    assert url_host("127.0.0.1") == "127.0.0.1"
    assert url_host("0.0.0.0") == "127.0.0.1"
    assert url_host("::") == "[::1]"
    assert url_host("::1") == "[::1]"
    secrets = {new_secret() for _ in range(100)}
    assert len(secrets) == 100
    assert all(len(s) == 32 and s.replace("-", "").replace("_", "").isalnum() for s in secrets)
