"""The programs of examples/ run, as a user would run them, against a real node.

Each runs in a process of its own with the node's address as its argument; the retrying HTTP
example calls a local HTTP server that this test starts and makes fail on purpose.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from chronoq.node import Node
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RUN_TIMEOUT_S = 90.0
MAX_BODY = 64 * 1024


@pytest.fixture
async def live(make_node: NodeFactory) -> Node:
    return await make_node()  # system clock: tasks come due while the programs run


async def run(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.decode()
    print(text)
    assert proc.returncode == 0, text
    return text


class Endpoint:
    """A webhook receiver on loopback that answers 503 while ``healthy`` is false."""

    def __init__(self) -> None:
        self.healthy = False
        self.keys: list[str] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length", "0")), MAX_BODY)
                self.rfile.read(length)
                endpoint.keys.append(self.headers.get("Idempotency-Key", ""))
                self.send_response(200 if endpoint.healthy else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 5
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    thread = threading.Thread(target=e.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield e
    finally:
        e.server.shutdown()
        e.server.server_close()
        thread.join(5)


async def test_cron_in_a_time_zone_is_nine_in_paris(live: Node) -> None:
    out = await run("examples/cron_in_time_zone.py", live.address)
    assert "T09:00:00+0" in out  # 09:00 at +01:00 or +02:00, by the season


async def test_retrying_http_call_goes_dead_then_its_handler_requeues_it(
    live: Node, endpoint: Endpoint
) -> None:
    out = await run("examples/retrying_http.py", live.address, endpoint.url, "work")
    assert "DEAD after 3 attempts" in out  # the endpoint failed every attempt
    assert len(endpoint.keys) == 3 and len(set(endpoint.keys)) == 1  # one key for all attempts

    endpoint.healthy = True  # the downstream is back: the dead-letter handler requeues
    out = await run("examples/retrying_http.py", live.address, endpoint.url, "requeue-dead")
    assert "dead letter" in out and "HTTP Error 503" in out  # the last error, as the DLQ shows it
    assert "SUCCEEDED" in out


async def test_rate_limited_worker_runs_every_task(live: Node) -> None:
    out = await run("examples/rate_limited_worker.py", live.address)
    assert out.startswith("30 starts over")
    span = float(out.split("over ")[1].split(" s")[0])
    assert span >= 1.5  # 30 starts at 10 a second cannot come faster than that (a lower bound)
