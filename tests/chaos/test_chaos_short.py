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

from chronoq.chaos.fault_plan import FaultKind
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


GREY = (FaultKind.DISK_FULL, FaultKind.SLOW_LINKS_POSTGRES, FaultKind.CLOCK_DRIFT)
# Shorter than a long run's holds, so the three fit in 45 s; the drift still crosses the
# nodes' 500 ms bound (1 s peak after 8 s), so the node has to notice it by itself.
GREY_HOLDS = {FaultKind.DISK_FULL: 4.0, FaultKind.SLOW_LINKS_POSTGRES: 6.0,
              FaultKind.CLOCK_DRIFT: 12.0}


def test_grey_faults_lose_nothing_and_are_felt(tmp_path: Path) -> None:
    """A full disk under PostgreSQL, slow and lossy links to it, a drifting clock: no check
    fails, and each fault did what it says (a node refused submits as UNAVAILABLE while the
    disk was full and accepted them again after; the drifting node found its clock off)."""
    options = ChaosOptions(
        duration=45, nodes=3, workers=2, etcd_members=1, faults=GREY, seed=2, rate=20,
        partitions=32, lease_ttl=2, tick_ms=50, out=tmp_path, quiesce_timeout=60,
        holds=GREY_HOLDS, plot=False,
    )
    console = Console(record=True, width=160)
    code = run(options, console)
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0 and report["ok"], console.export_text()
    faults = {f["kind"]: f for f in report["faults"] if not f["error"]}
    skipped = report["meta"]["faults_skipped"]
    assert set(faults) | set(skipped) == {k.value for k in GREY}, report["faults"]
    if "disk-full" in faults:
        disk = faults["disk-full"]["detail"]
        assert disk["ballast_bytes"] > 0
        assert disk["probes_during"].get("UNAVAILABLE", 0) >= 1, disk
        assert disk["first_refusal"].startswith("UNAVAILABLE"), disk
        assert disk["accepted_again_after_s"] is not None, disk
    else:  # only where a filesystem cannot be mounted (not root): said, not hidden
        assert skipped["disk-full"], skipped
    drifted = faults["clock-drift"]["target"]
    assert "clock off by" in (tmp_path / "cluster" / f"{drifted}.log").read_text()
    assert "resets" in faults["slow-links-postgres"]["detail"]


@pytest.mark.slow
def test_grey_faults_at_full_strength(tmp_path: Path) -> None:
    """The four grey faults with the holds of a long run (the etcd links too): no check fails."""
    kinds = (*GREY, FaultKind.SLOW_LINKS_ETCD)
    options = ChaosOptions(
        duration=100, nodes=3, workers=2, etcd_members=1, faults=kinds, seed=3, rate=20,
        partitions=32, lease_ttl=2, tick_ms=50, out=tmp_path, quiesce_timeout=60, plot=False,
    )
    console = Console(record=True, width=160)
    code = run(options, console)
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0 and report["ok"], console.export_text()
    done = {f["kind"] for f in report["faults"] if not f["error"]}
    assert done | set(report["meta"]["faults_skipped"]) == {k.value for k in kinds}
