"""The TypeScript client (clients/typescript) end to end against a real node.

Needs Node.js and npm (``.ci/run`` installs them): ``npm ci`` into the folder when its
node_modules is missing, ``tsc``, then the example submits tasks and runs its worker loop
(claim, heartbeat, complete) against a node started here, next to a Python client.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chronoq.client import Client
from chronoq.client.payload import decode
from chronoq.models import APPLICATION_JSON, OCTET_STREAM, TaskState
from chronoq.node import Node
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(300)

FOLDER = Path(__file__).resolve().parents[2] / "clients" / "typescript"
PROTO = FOLDER.parents[1] / "proto"
#: Seconds for ``npm ci`` (downloads from the registry on a fresh machine) and for ``tsc``.
INSTALL_TIMEOUT = 240
BUILD_TIMEOUT = 120
RUN_TIMEOUT = 60
#: The header line naming the protoc version: it may differ between machines, the code not.
_PROTOC_LINE = "//   protoc "


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=FOLDER, capture_output=True, text=True, timeout=timeout, check=False
    )


def installed() -> str:
    """The client's node_modules, after ``npm ci`` if they are missing (any test that runs
    the TypeScript client calls this first, whichever runs first); ``npx``. Skips without
    Node.js or npm."""
    node, npm, npx = shutil.which("node"), shutil.which("npm"), shutil.which("npx")
    if not (node and npm and npx):
        pytest.skip("Node.js and npm are not installed (.ci/run installs them)")
    if not (FOLDER / "node_modules" / ".bin" / "tsc").exists():
        done = _run([npm, "ci", "--no-audit", "--no-fund"], INSTALL_TIMEOUT)
        if done.returncode:
            pytest.skip(f"npm ci failed (no registry?): {done.stderr[-500:]}")
    return npx


@pytest.fixture(scope="module")
def built() -> Path:
    """The compiled client, after ``npm ci`` if needed; skips without Node.js or npm."""
    npx = installed()
    compiled = _run([npx, "tsc", "-p", "."], BUILD_TIMEOUT)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    return FOLDER / "dist" / "examples" / "roundtrip.js"


def _generated(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): "".join(
            line for line in p.read_text().splitlines(True) if not line.startswith(_PROTOC_LINE)
        )
        for p in sorted(root.rglob("*.ts"))
    }


def test_generated_code_matches_the_protos() -> None:
    """Cheap: src/generated was made from the .proto files as they are now (its generate
    script records their hash); else run `npm run generate` in clients/typescript."""
    digest = hashlib.sha256()
    for name in ("tasks.proto", "worker.proto"):
        digest.update((PROTO / "chronoq" / "v1" / name).read_bytes())
    recorded = (FOLDER / "src" / "generated" / "proto.sha256").read_text().strip()
    assert recorded == digest.hexdigest(), (
        "clients/typescript/src/generated is stale: run `PYTHON=.venv/bin/python npm run "
        "generate` in clients/typescript (needs its node_modules)"
    )


@pytest.mark.slow
def test_generated_code_is_what_the_generator_makes(built: Path, tmp_path: Path) -> None:
    """Thorough (slow: runs the generator): src/generated is byte for byte what ts-proto makes
    of proto/ now, besides the protoc version line."""
    plugin = FOLDER / "node_modules" / ".bin" / "protoc-gen-ts_proto"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--plugin=protoc-gen-ts_proto={plugin}",
            f"--ts_proto_out={tmp_path}",
            "--ts_proto_opt=outputServices=grpc-js,esModuleInterop=true,useDate=true,"
            "forceLong=number,env=node",
            f"-I{PROTO}",
            str(PROTO / "chronoq" / "v1" / "tasks.proto"),
            str(PROTO / "chronoq" / "v1" / "worker.proto"),
        ],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert _generated(tmp_path) == _generated(FOLDER / "src" / "generated"), (
        "clients/typescript/src/generated is stale: run `npm run generate` there"
    )


async def test_typescript_client_submits_and_works_tasks(
    built: Path, make_node: NodeFactory
) -> None:
    node: Node = await make_node()  # system clock
    from_python = [{"lang": "python", "text": "Grüße 🌍", "i": i} for i in range(2)]
    async with Client(node.address) as client:
        for value in from_python:
            await client.submit("from-python", payload=value)
        proc = await asyncio.create_subprocess_exec(
            shutil.which("node") or "node",
            str(built),
            node.address,
            str(len(from_python)),
            cwd=FOLDER,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, stdout.decode() + stderr.decode()
        report = json.loads(stdout.decode().strip().splitlines()[-1])

        handled = report["handled"]
        assert (
            sorted(
                (h["data"] for h in handled if h["queue"] == "from-python"), key=lambda d: d["i"]
            )
            == from_python
        )
        jobs = [h for h in handled if h["queue"] == "ts-jobs"]
        assert {h["contentType"] for h in jobs} == {APPLICATION_JSON, OCTET_STREAM}
        assert {"bytes": [0, 1, 2]} in [h["data"] for h in jobs]
        assert report["done"] and report["slowAttempts"] == 1  # heartbeats kept its lease
        assert report["flakyAttempts"] == 2  # Fail reported, then retried
        assert "first attempt fails on purpose" in report["flakyError"]
        assert report["stats"]["failed"] == 1

        # What the Node client submitted, read by Python: the content type travelled.
        first = await client.get(report["submitted"][0])
        assert first.state is TaskState.SUCCEEDED
        assert first.content_type == APPLICATION_JSON
        assert decode(first.payload, first.content_type) == {
            "n": 0,
            "text": "héllo ✓ 東京",
            "nested": {"list": [0, None, True]},
        }

        # Every queue control the Node client sent, as it read it back and as Python reads it.
        controls = report["controls"]
        assert controls["concurrencyKey"] == "customer-7" and controls["uniqueKey"] == "report-7"
        assert controls["debounceKey"] == "sync-7"
        assert controls["labels"] == {"team": "billing", "tier": "gold"}
        assert controls["uniqueUntil"] and controls["debounceUntil"]
        stored = await client.get(controls["id"])
        assert (stored.concurrency_key, stored.unique_key, stored.debounce_key) == (
            "customer-7",
            "report-7",
            "sync-7",
        )
        assert stored.labels == (("team", "billing"), ("tier", "gold"))
        assert stored.unique_until is not None and stored.debounce_until is not None
        assert stored.unique_until.isoformat().startswith(controls["uniqueUntil"][:19])
