"""The throughput benchmark's backlog phase: end to end and lateness on an empty table and on
top of tasks due tomorrow, each figure beside the empty run (tiny sizes; no timings asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chronoq.bench.throughput import main
from chronoq.embedded.postgres import EmbeddedPostgres

pytestmark = pytest.mark.timeout(180)


def test_backlog_phase_reports_beside_the_empty_run(
    postgres: EmbeddedPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    main(
        tasks=300, workers=1, concurrency=8, dsn=postgres.dsn, data_dir=tmp_path,
        due_rate=200, lateness_seconds=1.0, layouts="in-process", phases="backlog",
        backlog_sizes="2000", backlog_runs=2, json_out=out,
    )
    printed = capsys.readouterr().out
    assert "due tomorrow" in printed and "of empty" in printed
    assert "median of 2" in printed
    runs = json.loads(out.read_text())["backlog"]
    assert [r["pending"] for r in runs] == [0, 2000]
    for run in runs:
        # Each table measured twice (the first measurement's tasks gone before the second),
        # the backlog kept; the reported run is one of them.
        assert len(run["end_to_end_runs"]) == len(run["lateness_runs"]) == 2
        assert run["end_to_end"] in run["end_to_end_runs"]
        assert run["lateness"] in run["lateness_runs"]
        for e2e in run["end_to_end_runs"]:
            assert e2e["completed"] == 300
        for late in run["lateness_runs"]:
            assert late["fired"] == late["tasks"] == late["completed"] == 200
