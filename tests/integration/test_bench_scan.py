"""``chronoq bench scan`` runs at tiny sizes and its figures have the design's shape.

Only structure is asserted (rows examined, files written), never timings: benchmarks report
numbers, they do not pass or fail on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chronoq.bench.scan import main, parse_sizes
from chronoq.embedded.postgres import EmbeddedPostgres

pytestmark = pytest.mark.timeout(120)


def test_parse_sizes() -> None:
    assert parse_sizes("100k, 1m,10M,2500") == [2_500, 100_000, 1_000_000, 10_000_000]
    assert parse_sizes("1.5k") == [1_500]
    for bad in ("", "ten", "0", "1.2345k"):
        with pytest.raises(ValueError, match="--sizes"):
            parse_sizes(bad)


def test_bucketed_scan_examines_the_due_rows_while_full_scans_grow(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    report = main(sizes="2k,10k", repeats=2, partitions=16, nodes=3, dsn=postgres.dsn,
                  out_dir=tmp_path)
    data = json.loads((tmp_path / "scan.json").read_text())
    assert (tmp_path / "scan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plans = (tmp_path / "scan-plans.txt").read_text()
    assert "Seq Scan on tasks" in plans and "tasks_due" in plans and "Buffers:" in plans

    assert [load["pending"] for load in data["loads"]] == [2_000, 10_000]
    by = {(m["strategy"], m["pending"]): m for m in data["measurements"]}
    assert len(by) == 6 * 2 == len(report.measurements)
    for size in (2_000, 10_000):
        full, walk, bounded = by["a", size], by["b", size], by["b2", size]
        one, node, every = by["c", size], by["c2", size], by["c3", size]
        # every strategy finds the same due rows (c and c2 a share of them) ...
        assert full["due"] == walk["due"] == bounded["due"] == every["due"] > 0
        assert 0 < one["due"] <= every["due"] and node["due"] <= every["due"]
        # ... the watermark reads exactly those, the bucketed scans those plus one index probe
        # per (bucket, namespace) lane of each partition's due window (two buckets here) ...
        assert bounded["examined"] == bounded["due"], bounded
        for m in (one, node, every):
            assert m["due"] <= m["examined"] <= m["due"] + 2 * m["partitions_scanned"], m
        # ... while the full scan reads the whole table and the run_at index the history
        assert full["examined"] == 2 * size
        assert walk["examined"] >= size + walk["due"]
        assert "Seq Scan" in full["plan"] and "tasks_bench_run_at" in walk["plan"]
        assert "tasks_due" in every["plan"]
        for m in (full, walk, bounded, one, node, every):
            assert m["ms_per_tick"] > 0 and m["client_ms"] > 0
            assert m["shared_hit"] + m["shared_read"] > 0
    assert by["a", 10_000]["examined"] > by["a", 2_000]["examined"]
    assert by["b", 10_000]["examined"] > by["b", 2_000]["examined"]


def test_a_smaller_history_loads_and_reads_only_what_it_holds(
    postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    report = main(sizes="4k", repeats=1, partitions=16, nodes=3, dsn=postgres.dsn,
                  out_dir=tmp_path, only="a,c3", history=0.25)
    (load,) = report.loads
    assert (load.pending, load.history) == (4_000, 1_000)
    by = {m.strategy: m for m in report.measurements}
    assert set(by) == {"a", "c3"}
    assert by["a"].examined == 5_000 and by["a"].due == by["c3"].due > 0
    assert "+ 1k history" in (tmp_path / "scan-plans.txt").read_text()


def test_no_history_and_bounds(postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    report = main(sizes="2k", repeats=1, partitions=16, dsn=postgres.dsn, out_dir=tmp_path,
                  only="a", history=0)
    assert report.loads[0].history == 0 and report.measurements[0].examined == 2_000
    for bad in (-0.5, 11.0):
        with pytest.raises(ValueError, match="--history"):
            main(sizes="2k", dsn=postgres.dsn, out_dir=tmp_path, history=bad)
