"""Who may read a node's /metrics: the scrape token, and the refusal of an open endpoint.

The attacks: a scraper without the token, or with a wrong one, reads the page or makes the
node render it (the flood that raised another tenant's latency); a node serves /metrics
beyond loopback with no token at all; a token file another account could read or replace.
The page is the real WSGI app, called as its HTTP server calls it (the integration tier
scrapes a real node over HTTP).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from typer.testing import CliRunner

from chronoq.auth import ScrapeToken
from chronoq.cli import app
from chronoq.config import NodeSettings, is_loopback
from chronoq.errors import ConfigError
from chronoq.node.metrics import NodeMetrics, ScrapePage, scrape_token

TOKEN = "scrape-0123456789abcdef-token"
OTHER_UID = 54321  # an account that is neither us nor root


# ------------------------------------------------------------------------------ the token


def test_the_token_is_admitted_and_nothing_else() -> None:
    token = ScrapeToken(TOKEN)
    assert token.admits(f"Bearer {TOKEN}")
    assert token.admits(f"bearer  {TOKEN} ")  # the scheme is case-insensitive
    for refused in (None, "", "Bearer", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x",
                    f"Bearer {TOKEN[:-1]}", "Bearer another-token-0123456789"):
        assert not token.admits(refused), refused


def test_a_digest_admits_its_token_without_holding_it() -> None:
    digest = f"sha256:{hashlib.sha256(TOKEN.encode()).hexdigest()}"
    token = ScrapeToken(digest)
    assert token.admits(f"Bearer {TOKEN}")
    assert not token.admits(f"Bearer {digest}")  # the digest is not the password
    assert TOKEN not in repr(token) and digest not in repr(token)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("short-token", "shorter than 16 characters"),
        ("", "non-empty string"),
        ("two words-0123456789", "without spaces"),
        ("sha256:abcd", "64 hex digits"),
    ],
)
def test_a_weak_or_malformed_token_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ScrapeToken(text)


# ------------------------------------------------------------------------------ the page


class _Call:
    """One request to the WSGI app: its status, headers and body."""

    def __init__(
        self, page: ScrapePage, authorization: str | None, path: str = "/metrics", *,
        gzipped: bool = False,
    ):
        environ: dict[str, Any] = {"PATH_INFO": path}
        if gzipped:
            environ["HTTP_ACCEPT_ENCODING"] = "gzip, deflate"
        if authorization is not None:
            environ["HTTP_AUTHORIZATION"] = authorization
        self.headers: dict[str, str] = {}

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            self.status = status
            self.headers = dict(headers)

        self.body = b"".join(page.app(environ, start_response))


@pytest.fixture
def page() -> ScrapePage:
    registry = CollectorRegistry()
    Counter("chronoq_probe", "A test's counter.", registry=registry).inc()
    return ScrapePage(registry, cache=0.0, token=ScrapeToken(TOKEN))  # no cache: each renders


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}"])
@pytest.mark.parametrize("path", ["/metrics", "/", "/elsewhere"])
def test_no_or_a_wrong_token_gets_401_and_renders_nothing(
    page: ScrapePage, authorization: str | None, path: str
) -> None:
    for _ in range(50):  # a flood costs no rendering
        call = _Call(page, authorization, path)
        assert call.status.startswith("401")
        assert call.headers["WWW-Authenticate"].startswith("Bearer")
        assert b"chronoq_probe" not in call.body
    assert page.renders == 0
    assert page.refused == 50


def test_the_token_gets_the_page(page: ScrapePage) -> None:
    call = _Call(page, f"Bearer {TOKEN}")
    assert call.status.startswith("200")
    assert b"chronoq_probe_total 1.0" in call.body
    assert page.renders == 1 and page.refused == 0


def test_a_rendering_is_compressed_once_and_only_when_a_scraper_asks() -> None:
    registry = CollectorRegistry()
    Counter("chronoq_probe", "A test's counter.", registry=registry).inc()
    page = ScrapePage(registry, cache=3600.0)  # one rendering serves the whole test
    for _ in range(3):
        assert _Call(page, None).headers.get("Content-Encoding") is None
    assert page.renders == 1 and page.compressions == 0  # plain scrapers cost no gzip
    bodies = [_Call(page, None, gzipped=True) for _ in range(5)]
    assert {c.headers["Content-Encoding"] for c in bodies} == {"gzip"}
    assert {gzip.decompress(c.body) for c in bodies} == {_Call(page, None).body}
    assert page.renders == 1 and page.compressions == 1


def test_a_page_without_a_token_serves_everyone() -> None:
    metrics = NodeMetrics("n1")
    assert not metrics.page.guarded
    assert _Call(metrics.page, None).status.startswith("200")


# ------------------------------------------------------------------------------ settings


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_token(host: str) -> None:
    assert is_loopback(host)
    NodeSettings(dsn="", metrics_host=host, metrics_port=9464)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "metrics.example.org"])
def test_beyond_loopback_without_a_token_is_refused(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ConfigError, match="add --metrics-token-file"):
        NodeSettings(dsn="", metrics_host=host, metrics_port=9464)
    NodeSettings(dsn="", metrics_host=host, metrics_port=None)  # metrics off: nothing open
    NodeSettings(dsn="", metrics_host=host, metrics_port=9464, metrics_token=TOKEN)
    NodeSettings(dsn="", metrics_host=host, metrics_port=9464, metrics_insecure=True)


def test_the_token_is_given_once_and_never_shown() -> None:
    with pytest.raises(ConfigError, match="once"):
        NodeSettings(dsn="", metrics_token=TOKEN, metrics_token_file="/x")
    with pytest.raises(ConfigError, match="CHRONOQ_METRICS_TOKEN: the token is shorter"):
        NodeSettings(dsn="", metrics_token="short")
    assert TOKEN not in repr(NodeSettings(dsn="", metrics_token=TOKEN))


def _run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(
        app, ["node", "--dsn", "postgresql://chronoq@127.0.0.1:1/chronoq", *args],
        env={"COLUMNS": "300", "NO_COLOR": "1", **(env or {})},
    )


def test_the_node_refuses_to_start_with_open_metrics_beyond_loopback() -> None:
    """The CLI: one line naming the fix, before anything starts."""
    result = _run("--metrics-host", "0.0.0.0", "--metrics-port", "9464")
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "add --metrics-token-file" in lines[0], result.output
    assert "Traceback" not in result.output


def test_the_token_is_masked_in_the_effective_settings() -> None:
    result = _run("--show-config", env={"CHRONOQ_METRICS_TOKEN": TOKEN})
    assert result.exit_code == 0, result.output
    assert TOKEN not in result.output and "--metrics-token " in result.output


# ------------------------------------------------------------------------------ the file


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory of ours, 0700 (the file's checks are about it and the file)."""
    path = Path(tempfile.mkdtemp(prefix="chronoq-metrics-"))
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.chmod(0o700)
        path.rmdir()


def _token_file(base: Path, mode: int = 0o600, text: str = TOKEN + "\n") -> Path:
    path = base / "metrics-token"
    path.write_text(text)
    path.chmod(mode)
    return path


def _from_file(path: Path) -> ScrapeToken | None:
    return scrape_token(NodeSettings(dsn="", metrics_token_file=str(path)))


def test_a_private_token_file_is_read(base: Path) -> None:
    token = _from_file(_token_file(base))
    assert token is not None and token.admits(f"Bearer {TOKEN}")
    digest = f"sha256:{hashlib.sha256(TOKEN.encode()).hexdigest()}\n"
    token = _from_file(_token_file(base, text=digest))
    assert token is not None and token.admits(f"Bearer {TOKEN}")


@pytest.mark.parametrize(
    ("mode", "dir_mode", "message"),
    [
        (0o644, 0o700, "open to group or others.*chmod 600"),  # others read the token
        (0o622, 0o700, "writable by group or others.*chmod 600"),  # others rewrite it
        (0o600, 0o777, "which group or others may write.*chmod go-w"),  # or replace it
    ],
)
def test_a_token_file_others_could_read_or_replace_is_refused(
    base: Path, mode: int, dir_mode: int, message: str
) -> None:
    path = _token_file(base, mode)
    base.chmod(dir_mode)
    with pytest.raises(ConfigError, match=message):
        _from_file(path)


def test_a_token_file_under_a_directory_others_may_write_is_refused(base: Path) -> None:
    """Not only the file's own directory: one above it that others may write lets them
    replace the whole branch."""
    inner = base / "inner"
    inner.mkdir(mode=0o700)
    path = inner / "metrics-token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    base.chmod(0o777)
    try:
        with pytest.raises(ConfigError, match=f"lies in {base}, which group or others may write"):
            _from_file(path)
    finally:
        path.unlink()
        inner.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another uid")
def test_a_token_file_of_another_account_is_refused(base: Path) -> None:
    path = _token_file(base)
    os.chown(path, OTHER_UID, -1)
    with pytest.raises(ConfigError, match=f"belongs to uid {OTHER_UID}"):
        _from_file(path)


@pytest.mark.parametrize(
    ("text", "message"), [("", "is empty"), ("short\n", "shorter than 16 characters")]
)
def test_an_empty_or_weak_token_file_is_refused(base: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _from_file(_token_file(base, text=text))


def test_a_missing_token_file_is_refused(base: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        _from_file(base / "absent")

