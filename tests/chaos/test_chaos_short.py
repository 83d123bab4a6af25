"""A short chaos run in CI: the real harness, a real cluster, three faults, every check.

A node SIGKILLed, a node SIGSTOPped briefly (it keeps its lease) and once past its lease
TTL, a worker SIGKILLed mid-task, under a timed workload; the run fails on any violation of
the checker, the execution gap around node faults included. Longer runs: ``chronoq chaos``
(docs/chaos.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from chronoq.chaos.faults import FaultKind
from chronoq.chaos.harness import ChaosOptions, run

pytestmark = pytest.mark.timeout(240)

FAULTS = (
    FaultKind.KILL_NODE, FaultKind.FREEZE_NODE, FaultKind.FREEZE_NODE_PAST_TTL,
    FaultKind.KILL_WORKER,
)


def test_short_chaos_run_has_no_violation(tmp_path: Path) -> None:
    options = ChaosOptions(
        duration=40, nodes=3, workers=2, etcd_members=1, faults=FAULTS, seed=1, rate=20,
        partitions=32, lease_ttl=2, tick_ms=50, out=tmp_path, quiesce_timeout=60,
    )
    console = Console(record=True, width=120)
    code = run(options, console)
    report = json.loads((tmp_path / "report.json").read_text())
    injected = {f["kind"] for f in report["faults"] if not f["error"]}
    assert injected == {k.value for k in FAULTS}, report["faults"]
    assert report["figures"]["accepted"] > 500
    assert code == 0 and report["ok"], console.export_text()
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
