"""``chronoq bench throughput --store-shards 1,2`` runs at tiny sizes: a stack per shard count,
every server's share of the tasks and its CPU, beside the raw ceiling of one server.

Timings are not asserted (benchmarks report numbers); the shares are, since routing decides
them: with two shards each holds about half of the tasks. Two local stacks (servers, etcd,
node processes) take longer than the default tier allows: behind the slow marker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chronoq.bench.throughput import main
from chronoq.embedded.postgres import EmbeddedPostgres

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_each_shard_count_reports_rates_shares_and_server_cpu(
    postgres: EmbeddedPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    main(
        tasks=1000, workers=1, concurrency=16, dsn=postgres.dsn, data_dir=tmp_path,
        store_shards="1,2", json_out=out,
    )
    printed = capsys.readouterr().out
    assert "2 store shards, 2 nodes: submit" in printed
    assert "2 such server(s) on cores of their own" in printed
    data = json.loads(out.read_text())
    assert data["raw"]["insert_per_s"]["1"] > 0  # the raw ceiling of one server, same run
    one, two = data["shards"]
    assert [s["name"] for s in one["servers"]] == ["shard-0"]
    assert [s["name"] for s in two["servers"]] == ["shard-0", "shard-1"]
    for run in (one, two):
        assert sum(s["tasks"] for s in run["servers"]) == 1000
        assert run["submit_per_s"] > 0 and run["e2e_per_s"] > 0
        # Each server's own CPU (clock ticks of 10 ms: a thousand tasks may take less than one
        # to submit, never to submit and run).
        assert all(s["submit_cpu_s"] + s["e2e_cpu_s"] > 0 for s in run["servers"])
    # Keyed submits of random keys split evenly by partition: ~500 each (binomial, sd ~16).
    assert all(400 <= s["tasks"] <= 600 for s in two["servers"])
