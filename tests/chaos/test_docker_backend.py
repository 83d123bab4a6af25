"""The docker backend against a running compose deployment; skipped, saying why, where no
Docker engine (or no deployment) is there."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from chronoq.chaos.docker_backend import DockerBackend, DockerUnavailable
from chronoq.chaos.fault_plan import FaultKind
from chronoq.chaos.harness import ChaosOptions, run

pytestmark = pytest.mark.timeout(300)


def test_docker_backend_short_run(tmp_path: Path) -> None:
    try:
        backend = DockerBackend()
        backend.addresses  # noqa: B018 - the deployment must be up and publish its ports
    except DockerUnavailable as exc:
        pytest.skip(f"docker backend skipped: {exc.message}")
    options = ChaosOptions(
        duration=40, backend="docker", faults=(FaultKind.KILL_NODE, FaultKind.KILL_WORKER),
        workers=2, rate=20, out=tmp_path, partitions=256, lease_ttl=5, cluster="prod",
    )
    assert run(options, Console(width=120)) == 0
