"""The shards phase's arithmetic: each server's share of the tasks and its CPU per task, and
what N servers of that size would carry on cores of their own (``chronoq bench throughput
--store-shards``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from chronoq.bench.raw import BenchError, RawCeilings
from chronoq.bench.throughput.results import Report, ShardRun, ShardServerRun
from chronoq.bench.throughput.run import shard_counts
from chronoq.bench.throughput.table import render, shard_arithmetic
from chronoq.embedded.shards import StoreShards


def two_shards() -> ShardRun:
    # 10,000 tasks: shard-0 holds 4,000 and spent 0.12 s submitting, shard-1 6,000 and 0.15 s.
    return ShardRun(
        shards=2, nodes=2, tasks=10_000, submit_per_s=9_000.0, fire_per_s=20_000.0,
        e2e_per_s=4_000.0,
        servers=[
            ShardServerRun("shard-0", 4_000, submit_cpu_s=0.12, e2e_cpu_s=0.4),
            ShardServerRun("shard-1", 6_000, submit_cpu_s=0.15, e2e_cpu_s=0.6),
        ],
    )


def raw() -> RawCeilings:
    return RawCeilings(
        rows=10_000, insert_batch=1000, claim_batch=64, insert_per_s={1: 30_000.0},
        fire_per_s=15_000.0, fire_statements=3, claim_complete_per_s={1: 10_000.0},
    )


def test_shares_and_cpu_per_task_are_per_server() -> None:
    run = two_shards()
    first, second = run.servers
    assert run.share(first) == pytest.approx(0.4) and run.share(second) == pytest.approx(0.6)
    assert run.cpu_us_per_task(first) == pytest.approx(12.0)  # 0.12 s over all 10,000 tasks
    assert run.cpu_us_per_own_task(first) == pytest.approx(30.0)  # ... over its own 4,000
    assert run.cpu_us_per_own_task(second) == pytest.approx(25.0)
    assert run.total_cpu_us_per_task() == pytest.approx(27.0)
    assert run.total_cpu_us_per_task(e2e=True) == pytest.approx(100.0)


def test_the_busiest_server_sets_what_n_servers_would_carry() -> None:
    lines = shard_arithmetic([two_shards()], raw(), cpus=2)
    submit = next(line for line in lines if "submit" in line)
    # shard-0 spends 30 µs per task it holds: one core carries 33,333/s; two servers 66,667/s.
    assert "12.0 + 15.0 = 27.0 µs" in submit
    assert "at most 30.0 µs" in submit and "33,333 tasks/s" in submit
    assert "2 such server(s) on cores of their own 66,667 tasks/s" in submit
    assert "sharing 2 cores" in submit and "9,000/s" in submit
    ceilings = next(line for line in lines if "ceilings" in line)
    assert "x 2 server(s) = 60,000/s and 12,000/s" in ceilings  # pipeline 1/(1/15k + 1/10k)


def test_a_run_with_no_tasks_held_prints_no_arithmetic() -> None:
    run = ShardRun(1, 2, 0, 0.0, 0.0, 0.0, [ShardServerRun("shard-0", 0, 0.0, 0.0)])
    assert shard_arithmetic([run], None, cpus=2) == []


def test_the_table_shows_each_shard_beside_n_times_the_raw_ceiling() -> None:
    report = Report(started_at="", machine={}, postgres={}, params={}, raw=raw())
    report.shards.append(two_shards())
    console = Console(width=200, record=True, color_system=None)
    console.print(render(report))
    text = console.export_text()
    assert "2 store shards, 2 nodes: submit" in text and "2 x insert 30,000/s" in text
    assert "15%" in text  # 9,000 of 2 x 30,000
    assert "shard-1: 60% of tasks (ideal 50%)" in text and "submit 15.0 µs" in text


def test_shard_counts_are_checked() -> None:
    assert shard_counts("1,2,2") == (1, 2)
    with pytest.raises(BenchError, match="store-shards 9"):
        shard_counts("1,9")
    with pytest.raises(BenchError, match="not a count"):
        shard_counts("two")


def test_a_stack_of_one_shard_has_no_other_servers_to_stop(tmp_path: Path) -> None:
    shards = StoreShards(tmp_path, 1)  # shard-0 is the stack's own server: none made here
    shards.start()
    shards.stop()  # refused before: a pool of zero threads
    assert len(shards) == 0
