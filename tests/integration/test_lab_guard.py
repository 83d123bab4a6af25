"""The lab refuses what another web page could send it, over real HTTP to a live lab.

A two-node cluster on the virtual clock runs behind a real ``Lab``; the requests are what a
hostile page in the user's browser can make (a form POST with ``text/plain``, a DNS-rebound
host name, a foreign ``Origin``, no secret): each gets 403 and no node dies. The lab's own
requests (the secret from the URL, JSON) still work, down to killing an owner.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.lab.guard import SECRET_HEADER
from chronoq.lab.server import Lab
from chronoq.local.cluster import ClusterSpec, LocalCluster

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster(
    tmp_path: Path, postgres: EmbeddedPostgres, template_db: str, etcd: Any
) -> Iterator[LocalCluster]:
    database = f"lab_{uuid.uuid4().hex[:10]}"
    dsn = postgres.create_database(database, template=template_db)
    spec = ClusterSpec(
        nodes=2,
        partitions=8,
        lease_ttl=2,
        tick_ms=50,
        virtual_clock=True,
        cluster=f"lab{uuid.uuid4().hex[:8]}",
        durable=False,
    )
    local = LocalCluster(tmp_path / "cluster", spec, postgres=postgres, etcd=etcd, dsn=dsn)
    try:
        local.start()
        yield local
    finally:
        local.stop()
        postgres.drop_database(database)


@pytest.fixture
async def lab(cluster: LocalCluster) -> AsyncIterator[Lab]:
    lab = Lab(cluster, port=0, concurrency=4)
    try:
        await lab.start()
        yield lab
    finally:
        await lab.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def _base(lab: Lab) -> tuple[str, str, str]:
    """The lab's base URL, its host:port, and the secret from the printed URL's fragment."""
    parts = urlsplit(lab.url)
    return f"http://{parts.netloc}", parts.netloc, parts.fragment


async def _refused(response: aiohttp.ClientResponse, reason: str) -> None:
    body = await response.json()
    assert response.status == 403, body
    assert reason in body["error"]


def test_the_printed_url_carries_the_secret_in_its_fragment(lab: Lab) -> None:
    parts = urlsplit(lab.url)
    assert parts.scheme == "http" and parts.hostname == "127.0.0.1" and parts.path == "/"
    assert parts.fragment == lab.secret and len(lab.secret) >= 32


async def test_what_another_page_can_send_is_refused_and_nothing_is_killed(
    lab: Lab, cluster: LocalCluster, http: aiohttp.ClientSession
) -> None:
    base, netloc, secret = _base(lab)
    kill = f"{base}/api/kill"
    body = json.dumps({"partition": 0})
    good = {SECRET_HEADER: secret, "Content-Type": "application/json"}

    # A cross-site HTML form: text/plain, the foreign Origin, no secret.
    await _refused(
        await http.post(
            kill,
            data=body,
            headers={
                "Content-Type": "text/plain",
                "Origin": "http://evil.example",
                "Sec-Fetch-Site": "cross-site",
            },
        ),
        "cross-origin",
    )
    # Each defence on its own, everything else right.
    await _refused(
        await http.post(kill, data=body, headers={**good, "Content-Type": "text/plain"}),
        "Content-Type: application/json",
    )
    await _refused(
        await http.post(kill, data=body, headers={SECRET_HEADER: secret}),
        "Content-Type: application/json",
    )
    await _refused(
        await http.post(kill, data=body, headers={**good, "Host": "evil.example"}),
        "not this lab's address",
    )
    port = netloc.rsplit(":", 1)[1]
    rebound = f"rebind.evil.example:{port}"  # DNS rebinding: the right port, a foreign name
    await _refused(
        await http.post(kill, data=body, headers={**good, "Host": rebound}),
        "not this lab's address",
    )
    await _refused(
        await http.post(kill, data=body, headers={**good, "Origin": f"http://{rebound}"}),
        "cross-origin",
    )
    await _refused(
        await http.post(kill, data=body, headers={**good, "Origin": "null"}), "cross-origin"
    )
    await _refused(
        await http.post(kill, data=body, headers={**good, "Sec-Fetch-Site": "cross-site"}),
        "cross-site",
    )
    await _refused(
        await http.post(kill, data=body, headers={"Content-Type": "application/json"}),
        SECRET_HEADER,
    )
    await _refused(
        await http.post(kill, data=body, headers={**good, SECRET_HEADER: "guess"}), SECRET_HEADER
    )
    # Reading is guarded too: the state needs the secret, nothing answers a rebound name.
    await _refused(await http.get(f"{base}/api/state"), SECRET_HEADER)
    await _refused(await http.get(f"{base}/", headers={"Host": rebound}), "not this lab's")
    await _refused(
        await http.get(f"{base}/static/lab.js", headers={"Host": rebound}), "not this lab's"
    )

    await asyncio.sleep(0.5)
    assert all(node.alive() for node in cluster.nodes.values())


async def test_the_page_with_its_secret_works(
    lab: Lab, cluster: LocalCluster, http: aiohttp.ClientSession
) -> None:
    base, netloc, secret = _base(lab)
    page = await http.get(f"{base}/")
    assert page.status == 200 and "chronoq lab" in await page.text()
    assert page.headers["X-Frame-Options"] == "DENY"
    script = await http.get(
        f"{base}/static/lab.js", headers={"Host": netloc.replace("127.0.0.1", "localhost")}
    )
    assert script.status == 200 and SECRET_HEADER in await script.text()

    state = await http.get(
        f"{base}/api/state",
        headers={SECRET_HEADER: secret, "Origin": base, "Sec-Fetch-Site": "same-origin"},
    )
    assert state.status == 200
    assert len((await state.json())["nodes"]) == 2

    # The lab's own kill (as lab.js sends it) goes through; a node dies.
    headers = {SECRET_HEADER: secret, "Origin": base, "Content-Type": "application/json"}
    for _ in range(100):  # until partition 0 has an owner (the nodes have just started)
        response = await http.post(f"{base}/api/kill", json={"partition": 0}, headers=headers)
        if response.status != 409:
            break
        await asyncio.sleep(0.2)
    result = await response.json()
    assert response.status == 200, result
    victim = result["victim"]
    assert not cluster.nodes[victim].alive()
    assert sum(node.alive() for node in cluster.nodes.values()) == 1


async def test_every_response_carries_the_strict_script_policy(
    lab: Lab, http: aiohttp.ClientSession
) -> None:
    """The page, its static files, the API, refusals and unknown paths all carry the CSP
    that runs the lab's own files only; the page has no inline script or style, and its
    script builds elements, never HTML from data."""
    from importlib import resources

    from chronoq.origins import CONTENT_SECURITY_POLICY as POLICY

    base, _, secret = _base(lab)
    own = {SECRET_HEADER: secret, "Origin": base, "Sec-Fetch-Site": "same-origin"}
    asked = [("/", {}), ("/static/lab.js", {}), ("/static/lab.css", {}),
             ("/static/missing.js", {}), ("/api/state", own), ("/api/state", {}),
             ("/nowhere", own)]
    for path, headers in asked:
        r = await http.get(f"{base}{path}", headers=headers)
        assert r.headers.get("Content-Security-Policy") == POLICY, (path, r.status)
        assert r.headers["X-Frame-Options"] == "DENY"
    refused = await http.post(f"{base}/api/kill", data="partition=0")
    assert refused.status == 403 and refused.headers["Content-Security-Policy"] == POLICY
    static = resources.files("chronoq.lab").joinpath("static")
    page = static.joinpath("index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)|<style|\sstyle\s*=|\son[a-z]+\s*=", page)
    assert "innerHTML" not in static.joinpath("lab.js").read_text()
