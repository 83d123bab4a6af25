"""The chaos harness's seeded plans: the same seed replays the same run."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from chronoq.chaos.fault_plan import ALL_KINDS, FaultKind, default_holds, parse_kinds, schedule
from chronoq.chaos.ledger import LedgerWriter, read_file
from chronoq.chaos.workload import MIX, plan_tasks

HOLDS = default_holds(2, 4)


def test_fault_schedule_replays_from_its_seed() -> None:
    a = schedule(ALL_KINDS, 300, seed=7, holds=HOLDS)
    assert a == schedule(ALL_KINDS, 300, seed=7, holds=HOLDS)
    assert a != schedule(ALL_KINDS, 300, seed=8, holds=HOLDS)


def test_fault_schedule_covers_every_kind_without_overlap() -> None:
    plan = schedule(ALL_KINDS, 300, seed=3, holds=HOLDS)
    assert {p.kind for p in plan} == set(ALL_KINDS)
    for before, after in itertools.pairwise(plan):
        assert after.at >= before.at + before.hold  # one fault at a time
    assert plan[-1].at + plan[-1].hold < 300


def test_short_run_fits_what_it_can() -> None:
    plan = schedule([FaultKind.KILL_NODE, FaultKind.FREEZE_NODE_PAST_TTL, FaultKind.KILL_WORKER], 40,
                    seed=1, holds=HOLDS)
    assert {p.kind for p in plan} == {FaultKind.KILL_NODE, FaultKind.FREEZE_NODE_PAST_TTL,
                                      FaultKind.KILL_WORKER}


def test_parse_kinds() -> None:
    assert parse_kinds("kill-node, pause-worker") == [FaultKind.KILL_NODE,
                                                      FaultKind.PAUSE_WORKER]
    assert parse_kinds("all") == list(ALL_KINDS)
    with pytest.raises(ValueError, match="unknown fault 'nap-node'"):
        parse_kinds("nap-node")


def test_workload_replays_from_its_seed_and_stays_inside_the_run() -> None:
    plans = plan_tasks(5, duration=60, rate=50)
    assert plans == plan_tasks(5, duration=60, rate=50)
    assert len({p.key for p in plans}) == len(plans)
    assert all(p.run_at <= 60 for p in plans if p.kind != "cancel")
    assert all(p.submit_at <= p.run_at for p in plans)
    kinds = {p.kind for p in plans}
    assert kinds == set(MIX)
    assert all(p.cancel_at is not None for p in plans if p.kind == "cancel")


def test_ledger_pairs_starts_and_ends_and_survives_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "w0.1.jsonl"
    ledger = LedgerWriter(path, "w0.1")
    ledger.start("t1", 1, 10, "k1")
    ledger.end("t1", 1, "ok")
    ledger.start("t2", 1, 20, "k2")  # killed before its end
    ledger.close()
    with path.open("a") as f:
        f.write('{"e": "end", "task": "t2"')  # torn by the kill
    runs = {x.task_id: x for x in read_file(path)}
    assert runs["t1"].outcome == "ok" and runs["t1"].end_us is not None
    assert runs["t2"].outcome is None and runs["t2"].end_us is None
    assert runs["t2"].worker == "w0.1" and runs["t2"].key == "k2"
