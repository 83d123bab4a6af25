"""The store shards' chaos fault: chosen only where there are shards, and a shard outage's
report separates the firing gap of the surviving shards' partitions from the down one's."""

from __future__ import annotations

from chronoq.chaos.checker import DUPLICATE_CAUSES, check, shard_outages
from chronoq.chaos.fault_plan import ALL_KINDS, SHARD_KINDS, FaultKind, parse_kinds
from chronoq.chaos.history import FaultRecord, History, Params, TaskRow

US = 1_000_000


def test_kill_shard_primary_is_in_all_only_with_store_shards() -> None:
    assert FaultKind.KILL_SHARD_PRIMARY not in ALL_KINDS
    assert FaultKind.KILL_SHARD_PRIMARY not in parse_kinds("all")
    assert set(SHARD_KINDS) <= set(parse_kinds("all", sharded=True))
    assert set(SHARD_KINDS) <= set(parse_kinds("all", replicated=True, sharded=True))
    assert parse_kinds("kill-shard-primary") == [FaultKind.KILL_SHARD_PRIMARY]
    assert "kill-shard-primary" in DUPLICATE_CAUSES


def _fired(task: int, partition: int, run_at_s: float, late_s: float) -> TaskRow:
    run_at = round(run_at_s * US)
    return TaskRow(
        id=f"t{task}", key=f"k{task}", partition=partition, state="SUCCEEDED", attempt=1,
        run_at_us=run_at, fired_at_us=run_at + round(late_s * US), fired_by="node-0",
        fire_token=1, last_error=None,
    )


def test_a_shard_outage_reports_the_surviving_and_the_down_partitions_apart() -> None:
    # Partitions 0-3 on shard-0, 4-7 on shard-1; shard-1 down from 10 s to 14 s.
    fault = FaultRecord(
        "kill-shard-primary", "shard-1", 10 * US, 14 * US,
        {"partitions": [4, 5, 6, 7], "pid": 4242, "writable_after_s": 3.9},
    )
    tasks = [
        _fired(1, 0, 11.0, 0.05),  # a surviving partition, on time
        _fired(2, 2, 12.0, 0.30),  # a surviving partition, 0.3 s late
        _fired(3, 5, 11.0, 3.20),  # the down shard: waited for its return
        _fired(4, 1, 20.0, 9.00),  # due after the outage: not counted
    ]
    history = History(
        params=Params(lease_ttl_s=2, tick_s=0.05, lease_timeout_s=5, partitions=8),
        started_us=0, ended_us=30 * US, tasks=tasks, faults=[fault],
    )
    [outage] = shard_outages(history)
    assert outage["target"] == "shard-1" and outage["pid"] == 4242
    assert (outage["partitions_down"], outage["partitions_surviving"]) == (4, 4)
    assert (outage["surviving_due"], outage["surviving_gap_s"]) == (2, 0.3)
    assert (outage["down_due"], outage["down_gap_s"]) == (1, 3.2)
    assert check(history).figures["shard_outages"] == [outage]


def test_move_partitions_is_a_shard_fault_with_a_kill_node_variant() -> None:
    from chronoq.chaos.fault_plan import default_holds, schedule

    assert FaultKind.MOVE_PARTITIONS in SHARD_KINDS
    assert FaultKind.MOVE_PARTITIONS not in parse_kinds("all")
    assert FaultKind.MOVE_PARTITIONS in parse_kinds("all", sharded=True)
    assert "move-partitions" in DUPLICATE_CAUSES
    holds = default_holds(2, 5)
    plan = schedule([FaultKind.MOVE_PARTITIONS], 2000, 7, holds)
    assert {p.variant for p in plan} == {"", "kill-node"}


def test_a_move_reports_the_firing_gap_of_the_moved_partitions_apart() -> None:
    from chronoq.chaos.checks.figures import shard_moves

    fault = FaultRecord(
        "move-partitions", "shard-0->shard-1", 10 * US, 14 * US,
        {"partitions": [2, 3], "move_id": "m1", "outcome": "committed", "killed": "node-0",
         "killed_in": "copy"},
    )  # fmt: skip
    tasks = [
        _fired(1, 2, 11.0, 0.70),  # moved: waited for the freeze and the map
        _fired(2, 0, 11.0, 0.05),  # another partition, on time
        _fired(3, 3, 20.0, 5.00),  # due after the move: not counted
    ]
    history = History(
        params=Params(lease_ttl_s=2, tick_s=0.05, lease_timeout_s=5, partitions=8),
        started_us=0, ended_us=30 * US, tasks=tasks, faults=[fault],
    )
    [move] = shard_moves(history)
    assert (move["moved_due"], move["moved_gap_s"]) == (1, 0.7)
    assert (move["others_due"], move["killed"], move["outcome"]) == (1, "node-0", "committed")
    assert check(history).figures["shard_moves"] == [move]
