"""A real node's /metrics with a token file, scraped over HTTP: the token, and only it, reads
the page, and a flood of requests without it makes the node render nothing.

The scrape is sent as Prometheus sends it with the compose deployment's job
(deploy/prometheus/prometheus.yml: ``authorization`` type and credentials file).
"""

from __future__ import annotations

import asyncio
import http.client
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from chronoq.errors import ConfigError
from tests.integration.conftest import NodeFactory

TOKEN = "scrape-token-for-a-real-node-0123456789"
PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "prometheus.yml"


@pytest.fixture
def token_file() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="chronoq-scrape-"))
    path = directory / "metrics-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        directory.rmdir()


def _get(port: int, authorization: str | None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": authorization} if authorization else {}
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def _prometheus_authorization() -> str:
    """The header the compose Prometheus job sends, from its scrape config."""
    [job] = yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    auth = job["authorization"]
    assert auth["credentials_file"]  # a file: the token is never in the config
    return f"{auth.get('type', 'Bearer')} {TOKEN}"


async def test_only_the_token_reads_metrics_and_refusals_render_nothing(
    make_node: NodeFactory, token_file: Path
) -> None:
    node = await make_node(metrics_port=0, metrics_token_file=str(token_file))
    port = node.metrics_port
    assert port and node.metrics.page.guarded
    before = node.metrics.page.renders
    attempts = [None, "Bearer wrong-token-0123456789abcdef", f"Basic {TOKEN}", TOKEN]
    answers = await asyncio.gather(
        *(asyncio.to_thread(_get, port, attempt) for attempt in attempts * 25)
    )
    for status, headers, body in answers:
        assert status == 401
        assert headers["WWW-Authenticate"].startswith("Bearer")
        assert b"chronoq_" not in body
    assert node.metrics.page.renders == before  # 100 refusals, no rendering
    assert node.metrics.page.refused == 100

    status, _, body = await asyncio.to_thread(_get, port, _prometheus_authorization())
    assert status == 200
    assert b"chronoq_tasks_fired_total" in body
    assert node.metrics.page.renders == before + 1


async def test_a_node_with_a_bad_token_file_does_not_start(
    make_node: NodeFactory, token_file: Path
) -> None:
    await asyncio.to_thread(token_file.chmod, 0o644)  # another account could read it
    with pytest.raises(ConfigError, match="chmod 600"):
        await make_node(metrics_port=0, metrics_token_file=str(token_file))


async def test_metrics_beyond_loopback_without_a_token_do_not_start(
    make_node: NodeFactory,
) -> None:
    """Refused before anything binds (so nothing listens beyond loopback in this test)."""
    with pytest.raises(ConfigError, match="add --metrics-token-file"):
        await make_node(metrics_port=0, metrics_host="0.0.0.0")
