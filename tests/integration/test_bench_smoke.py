"""The throughput benchmark runs end to end at tiny sizes and reports every figure.

Timings are not asserted: benchmarks report numbers, they do not pass or fail on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chronoq.bench.throughput import main
from chronoq.embedded.postgres import EmbeddedPostgres

pytestmark = pytest.mark.timeout(90)


def test_bench_runs_and_reports_every_figure(
    postgres: EmbeddedPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    main(
        tasks=500, workers=2, concurrency=16, dsn=postgres.dsn, data_dir=tmp_path,
        due_rate=200, lateness_seconds=1.5, pending_sizes="1000,2000", submitters="1,2",
        rss_settle_seconds=1.0, json_out=out,
    )
    printed = capsys.readouterr().out
    for label in ("submit", "fire", "end to end", "lateness", "node RSS", "chronoq / raw"):
        assert label in printed
    data = json.loads(out.read_text())
    raw = data["raw"]
    assert raw["fire_per_s"] > 0 and raw["pipeline_per_s"] > 0
    for key in ("insert_per_s", "claim_complete_per_s"):  # by connections
        assert set(raw[key]) == {"1", "2", "4"} and all(v > 0 for v in raw[key].values())
    assert [r["submitters"] for r in data["submit"]] == [1, 2]
    assert all(r["tasks_per_s"] > 0 for r in data["submit"])
    assert data["fire"]["tasks_per_s"] > 0
    assert {r["layout"] for r in data["end_to_end"]} == {"in-process", "processes"}
    assert all(r["completed"] == 500 for r in data["end_to_end"])
    assert all(r["pg_transactions_per_task"] > 0 for r in data["end_to_end"])
    late = data["lateness"]
    assert late["fired"] == late["tasks"] == 300
    for key in ("store_p50_ms", "store_p99_ms", "store_max_ms", "node_p50_ms", "node_p99_ms",
                "node_max_ms", "handler_p50_ms", "handler_p99_ms", "handler_max_ms"):
        assert late[key] >= 0
    assert [r["pending"] for r in data["rss"]] == [1000, 2000]
    assert all(r["rss_kib"] > 0 and r["ticks"] > 0 for r in data["rss"])
    assert "rss_growth_kib" in data and data["end_to_end_best"]["tasks_per_s"] > 0
    assert set(data["ratios"]) >= {"fire_vs_raw_fire", "submit_1_vs_raw_insert"}
