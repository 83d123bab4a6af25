"""The console's HTTP edge without a cluster: sessions, CSRF, JSON errors, no node answering.

The address points at a closed port: every gRPC call fails UNAVAILABLE, which the pages must
show as a clean error (HTTP 503 with the reason), not a traceback.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from chronoq.client import Client
from chronoq.console.guard import CSRF_HEADER, SESSION_COOKIE
from chronoq.console.server import Console, ConsoleSettings
from tests.integration.conftest import NodeFactory
from tests.integration.test_cluster_inproc import cluster

pytestmark = pytest.mark.timeout(60)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def console() -> AsyncIterator[Console]:
    settings = ConsoleSettings(address=f"127.0.0.1:{closed_port()}", port=0, refresh=0.5)
    console = Console(settings)
    await console.start()
    try:
        yield console
    finally:
        await console.stop()


async def test_session_csrf_and_errors(console: Console) -> None:
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for an IP address
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(f"{console.origin}/") as r:
            assert r.status == 401 and "printed" in await r.text()
        async with http.get(f"{console.origin}/login?key=wrong") as r:
            assert r.status == 401
        async with http.get(console.url) as r:  # follows the redirect to the overview
            assert r.status == 200 and r.url.path == "/"
            page = await r.text()
            assert r.headers["X-Frame-Options"] == "DENY"
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
        assert any(c.key == SESSION_COOKIE and c["httponly"] for c in jar)
        match = re.search(r'name="csrf-token" content="([^"]+)"', page)
        assert match is not None
        csrf = match.group(1)

        async with http.get(f"{console.origin}/api/overview") as r:
            overview = await r.json()
            assert r.status == 200 and overview["ok"] is False
            assert [a["reachable"] for a in overview["addresses"]] == [False]
        async with http.get(f"{console.origin}/api/tasks", params={"namespace": "default"}) as r:
            assert r.status == 503 and "UNAVAILABLE" in (await r.json())["error"]
        async with http.get(f"{console.origin}/api/tasks", params={"state": "lost"}) as r:
            assert r.status == 400 and "state" in (await r.json())["error"]
        async with http.get(f"{console.origin}/api/queues", params={"namespace": "no spaces"}) as r:
            assert r.status == 400 and "namespace" in (await r.json())["error"]

        body = {"namespace": "default", "ids": ["x"]}
        async with http.post(f"{console.origin}/api/tasks/cancel", json=body) as r:
            assert r.status == 403 and CSRF_HEADER in (await r.json())["error"]
        headers = {CSRF_HEADER: csrf}
        async with http.post(f"{console.origin}/api/tasks/cancel", data="ids=x",
                             headers={**headers, "Content-Type": "text/plain"}) as r:
            assert r.status == 415
        async with http.post(f"{console.origin}/api/tasks/cancel", json=body,
                             headers={**headers, "Origin": "http://evil.example"}) as r:
            assert r.status == 403
        async with http.post(f"{console.origin}/api/tasks/cancel", json={"ids": []},
                             headers=headers) as r:
            assert r.status == 400 and "ids" in (await r.json())["error"]
        async with http.post(f"{console.origin}/api/tasks/cancel", json=body,
                             headers=headers) as r:
            result = await r.json()
            assert r.status == 200 and result["results"][0]["ok"] is False
        async with http.post(f"{console.origin}/api/queues/limit", headers=headers,
                             json={"queue": "q", "rate": "fast"}) as r:
            assert r.status == 400 and "rate" in (await r.json())["error"]


async def test_every_response_carries_the_strict_script_policy(console: Console) -> None:
    """Pages, static files, API answers, refusals and unknown paths: each has the CSP that
    allows the console's own files only (no inline script or style), and no page inlines
    any."""
    from chronoq.console.server import PAGES
    from chronoq.origins import CONTENT_SECURITY_POLICY

    policy = CONTENT_SECURITY_POLICY
    for part in ("default-src 'self'", "script-src 'self'", "object-src 'none'",
                 "frame-ancestors 'none'"):
        assert part in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(f"{console.origin}/") as r:  # refused: no session yet
            assert r.status == 401 and r.headers["Content-Security-Policy"] == policy
        async with http.get(console.url) as r:
            assert r.status == 200
        paths = [*PAGES, "/static/console.js", "/static/console.css", "/static/uPlot.iife.min.js",
                 "/static/missing.js", "/api/overview", "/api/queues?namespace=no%20spaces",
                 "/nowhere"]
        for path in paths:
            async with http.get(f"{console.origin}{path}") as r:
                assert r.headers.get("Content-Security-Policy") == policy, (path, r.status)
                assert r.headers["X-Frame-Options"] == "DENY"
                if path in PAGES:
                    page = await r.text()
                    assert not re.search(r"<script(?![^>]*\bsrc=)", page), path
                    assert not re.search(r"<style|\sstyle\s*=|\son[a-z]+\s*=", page), path


# ---------------------------------------------------------------------- the shards page

ADMIN = "console-admin-token-for-shards"
TENANT = "console-tenant-token-for-shards"


def _password(url: str) -> str:
    password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    assert password  # else the test would prove nothing
    return password


@pytest.fixture
def shard_tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens]\n"{ADMIN}" = ["*"]\n"{TENANT}" = ["team-a"]\n')
    path.chmod(0o600)
    return path


async def _open(address: str, token: str) -> Console:
    settings = ConsoleSettings(address=address, port=0, refresh=0.5,
                               client_options={"token": token})
    console = Console(settings)
    await console.start()
    return console


async def _shards(http: aiohttp.ClientSession, console: Console) -> dict[str, Any]:
    async with http.get(f"{console.origin}/api/shards") as r:
        assert r.status == 200
        text = await r.text()
    data: dict[str, Any] = json.loads(text)
    data["_raw"] = text
    return data


async def test_the_shards_page_shows_one_shard_holding_everything_and_is_guarded(
    make_node: NodeFactory, dsn: str
) -> None:
    node = await make_node()
    console = await _open(node.address, "")
    try:
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            async with http.get(f"{console.origin}/api/shards") as r:  # no session yet
                assert r.status == 401 and "printed" in (await r.json())["error"]
            async with http.get(console.url) as r:
                assert r.status == 200
            async with http.get(f"{console.origin}/api/shards",
                                headers={"Host": f"rebound.example:{urlsplit(console.origin).port}"}) as r:
                assert r.status == 403 and "Host" in (await r.json())["error"]
            async with http.get(f"{console.origin}/api/shards",
                                headers={"Origin": "http://evil.example"}) as r:
                assert r.status == 403
            async with http.get(f"{console.origin}/shards") as r:
                assert r.status == 200 and 'data-page="shards"' in await r.text()
            view = await _shards(http, console)
        assert view["ok"] is True and view["answered_by"] == node.settings.node_id
        [shard] = view["shards"]
        assert (shard["name"], shard["health"], shard["partitions"],
                shard["partition_count"]) == ("shard-0", "ok", "0-15", 16)
        assert view["moves"] == [] and view["moves_in_progress"] == 0
        assert _password(dsn) not in view["_raw"] and "***" in shard["dsn"]
    finally:
        await console.stop()


async def test_the_shards_page_lists_shards_and_a_move_without_any_password(
    make_node: NodeFactory, etcd: Any, cluster_name: str, empty_db: str, dsn: str,
    shard_tokens: Path,
) -> None:
    node = await make_node(cluster=cluster(etcd, cluster_name), auth_tokens=str(shard_tokens))
    admin = Client(node.address, token=ADMIN, timeout=40)
    console = await _open(node.address, ADMIN)
    try:
        await admin.add_shard(empty_db)
        [asked] = await admin.move_partitions("8-15", "shard-1")
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            async with http.get(console.url) as r:
                assert r.status == 200
            for _ in range(120):  # the console polls Status every 0.5 s
                view = await _shards(http, console)
                if view.get("ok") and any(m["id"] == asked.id for m in view["moves"]):
                    break
                await asyncio.sleep(0.25)
        assert [s["name"] for s in view["shards"]] == ["shard-0", "shard-1"]
        [move] = [m for m in view["moves"] if m["id"] == asked.id]
        assert (move["partitions"], move["source"], move["target"]) == ("8-15", "shard-0",
                                                                         "shard-1")
        assert move["phase"] in {"requested", "prepare", "copy", "catch_up", "cut_over",
                                 "committed", "clean_up", "done"}, move
        assert isinstance(move["rows_copied"], int)
        held = sum(s["partition_count"] for s in view["shards"])
        assert held == 16  # every partition on exactly one shard, mid-move or after
        for url in (dsn, empty_db):
            assert _password(url) not in view["_raw"]
    finally:
        await console.stop()
        await admin.close()
