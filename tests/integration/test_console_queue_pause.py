"""The console's pause and resume of a queue: shown on the Queues page, an action behind the
console's session and CSRF token, passed to the node with the console's own token."""

from __future__ import annotations

import re

import aiohttp

from chronoq.console.guard import CSRF_HEADER
from chronoq.console.server import Console, ConsoleSettings
from chronoq.store import Store
from tests.integration.conftest import NodeFactory


async def test_the_queues_page_pauses_and_resumes_a_queue(
    make_node: NodeFactory, store: Store
) -> None:
    node = await make_node()
    console = Console(ConsoleSettings(address=node.address, port=0, refresh=0.5))
    await console.start()
    try:
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            body = {"namespace": "default", "queue": "cq"}
            async with http.post(f"{console.origin}/api/queues/pause", json=body) as r:
                assert r.status == 401  # no session
            async with http.get(console.url) as r:
                page = await r.text()
            match = re.search(r'name="csrf-token" content="([^"]+)"', page)
            assert match is not None
            async with http.post(f"{console.origin}/api/queues/pause", json=body) as r:
                assert r.status == 403  # a session without the CSRF token
            assert await store.gated_queues() == []
            headers = {CSRF_HEADER: match.group(1)}
            async with http.post(f"{console.origin}/api/queues/pause", json=body,
                                 headers=headers) as r:
                assert r.status == 200 and (await r.json())["paused"] is True
            async with http.get(f"{console.origin}/api/queues/settings",
                                params={"namespace": "default"}) as r:
                [row] = (await r.json())["queues"]
                assert row["queue"] == "cq" and row["paused"] and row["paused_at"]
            async with http.post(f"{console.origin}/api/queues/resume", json=body,
                                 headers=headers) as r:
                resumed = await r.json()
                assert r.status == 200 and resumed["paused"] is False
                assert resumed["skipped"] == 0
            async with http.post(f"{console.origin}/api/queues/pause", headers=headers,
                                 json={"namespace": "default", "queue": "bad name"}) as r:
                assert r.status == 400 and "queue" in (await r.json())["error"]
        assert await store.gated_queues() == []
    finally:
        await console.stop()
