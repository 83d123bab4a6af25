"""The chaos checker on synthetic histories: it passes a clean one and catches each fault
it exists to catch (a lost task, an early run, an unexplained duplicate, a stale token, a
slow failover, workers stalled during a node freeze), while excusing what an injected fault
explains."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from chronoq.chaos.checker import check
from chronoq.chaos.history import (
    ACCEPTED,
    AMBIGUOUS,
    CANCELLED,
    ERROR,
    OK,
    CancelRecord,
    Execution,
    FaultRecord,
    History,
    OwnerEvent,
    Params,
    SubmitRecord,
    TaskRow,
)

S = 1_000_000
T0 = 1_700_000_000 * S


def at(seconds: float) -> int:
    return T0 + round(seconds * S)


def submit(key: str, run_at: float, task_id: str, outcome: str = ACCEPTED) -> SubmitRecord:
    return SubmitRecord(key, "plain", at(run_at), "succeeded", outcome,
                        task_id if outcome == ACCEPTED else None, at(0), at(0.01), 1)


def row(task_id: str, key: str, run_at: float, *, state: str = "SUCCEEDED", attempt: int = 1,
        partition: int = 0, fired: float | None = None, by: str | None = "node-0",
        token: int | None = 10, error: str | None = None) -> TaskRow:
    """A final store row; ``by=None`` means never fired (cancelled before its time)."""
    fired_at = None if by is None else at(fired if fired is not None else run_at + 0.02)
    return TaskRow(task_id, key, partition, state, attempt, at(run_at), fired_at, by, token,
                   error)


def run(task_id: str, attempt: int, start: float, run_at: float, *, worker: str = "w0.1",
        outcome: str | None = OK) -> Execution:
    return Execution(task_id, attempt, worker, at(start), at(start + 0.1) if outcome else None,
                     outcome, at(run_at))


def clean() -> History:
    """Three tasks on two partitions, each fired by its owner and run once; one retried on
    purpose; one cancelled."""
    return History(
        params=Params(lease_ttl_s=2, tick_s=0.05, lease_timeout_s=4, partitions=2),
        started_us=at(0),
        ended_us=at(30),
        submits=[submit("a", 5, "t-a"), submit("b", 6, "t-b"), submit("c", 20, "t-c")],
        cancels=[CancelRecord("c", "t-c", at(8), at(8.01), CANCELLED)],
        executions=[
            run("t-a", 1, 5.05, 5),
            run("t-b", 1, 6.05, 6, outcome=ERROR),
            run("t-b", 2, 7.10, 7.0, worker="w1.1"),
        ],
        tasks=[
            row("t-a", "a", 5),
            row("t-b", "b", 7.0, attempt=2, partition=1, by="retry", token=None),
            row("t-c", "c", 20, state="CANCELLED", attempt=0, by=None, token=None),
        ],
        owners=[OwnerEvent(at(0), 0, "node-0", 10), OwnerEvent(at(0), 1, "node-1", 11)],
        fences={0: 10, 1: 11},
    )


def history() -> History:
    return clean()


def problems(h: History) -> dict[str, list[str]]:
    verdict = check(h)
    out: dict[str, list[str]] = {}
    for v in verdict.violations:
        out.setdefault(v.check, []).append(v.detail)
    return out


def test_clean_history_passes() -> None:
    verdict = check(history())
    assert verdict.ok, verdict.violations
    assert verdict.figures["lost"] == 0
    assert verdict.figures["duplicates"] == 0  # the retry after a planned failure is not one
    assert all(verdict.checks.values())


def test_lost_task_is_caught() -> None:
    h = history()
    h.tasks = [r for r in h.tasks if r.id != "t-a"]
    h.executions = [x for x in h.executions if x.task_id != "t-a"]
    found = problems(h)
    assert list(found) == ["none_lost"]
    assert "not in the store" in found["none_lost"][0]
    assert check(h).figures["lost"] == 1


def test_task_stuck_before_a_final_state_is_lost() -> None:
    h = history()
    h.tasks = [dataclasses.replace(r, state="RUNNING") if r.id == "t-a" else r for r in h.tasks]
    assert "never finished" in problems(h)["none_lost"][0]


def test_success_without_a_ledger_entry_is_caught() -> None:
    h = history()
    h.executions = [x for x in h.executions if x.task_id != "t-a"]
    assert "no worker recorded" in problems(h)["none_lost"][0]


def test_ambiguous_submit_may_be_absent_but_not_half_done() -> None:
    h = history()
    h.submits.append(submit("d", 9, "t-d", outcome=AMBIGUOUS))
    assert check(h).ok  # never committed: fine
    h.tasks.append(row("t-d", "d", 9, state="SCHEDULED", by=None, token=None))
    assert "never finished" in problems(h)["none_lost"][0]


def test_cancelled_without_a_cancel_is_caught() -> None:
    h = history()
    h.cancels = []
    assert "no cancel was acknowledged" in problems(h)["none_lost"][0]


def test_early_run_is_caught() -> None:
    h = history()
    h.executions[0] = run("t-a", 1, 4.5, 5)  # half a second before its run_at
    found = problems(h)
    assert list(found) == ["none_early"]
    assert "500.0 ms before" in found["none_early"][0]


def test_early_run_under_a_forward_clock_jump_is_excused_up_to_the_offset() -> None:
    h = history()
    h.executions[0] = run("t-a", 1, 4.5, 5)
    h.faults = [FaultRecord("clock-jump", "node-0", at(3), at(10), {"offset_ms": 1000})]
    verdict = check(h)
    assert verdict.ok, verdict.violations
    assert verdict.figures["early_under_clock_jump"] == 1
    h.executions[0] = run("t-a", 1, 3.5, 5)  # 1.5 s early: more than the clock was ahead
    assert "none_early" in problems(h)


def test_unexplained_duplicate_is_caught() -> None:
    h = history()
    h.executions.append(run("t-a", 2, 9.0, 5, worker="w1.1"))
    found = problems(h)
    assert list(found) == ["duplicates_explained"]
    assert check(h).figures["duplicates_unexplained"] == 1


def test_duplicate_after_a_worker_kill_mid_task_is_explained() -> None:
    h = history()
    h.executions[0] = run("t-a", 1, 5.05, 5, outcome=None)  # no end: the worker died
    h.executions.append(run("t-a", 2, 10.0, 5, worker="w1.1"))
    h.tasks = [dataclasses.replace(r, attempt=2) if r.id == "t-a" else r for r in h.tasks]
    h.faults = [FaultRecord("kill-worker", "w0.1", at(5.2), at(6.2))]
    verdict = check(h)
    assert verdict.ok, verdict.violations
    assert verdict.duplicates[0].explanation.startswith("kill-worker w0.1")  # type: ignore[union-attr]
    # The same kill of *another* worker explains nothing.
    h.faults = [FaultRecord("kill-worker", "w1.1", at(5.2), at(6.2))]
    assert "duplicates_explained" in problems(h)


def test_worker_frozen_between_claim_and_handler_is_explained() -> None:
    """Attempt 1 was claimed by w0.1 just before a pause; its lease expired, w1.1 ran
    attempt 2; after SIGCONT w0.1 started attempt 1 anyway, later than attempt 2."""
    h = history()
    h.executions[0] = run("t-a", 1, 12.0, 5)
    h.executions.append(run("t-a", 2, 10.0, 5, worker="w1.1"))
    h.tasks = [dataclasses.replace(r, attempt=2) if r.id == "t-a" else r for r in h.tasks]
    h.faults = [FaultRecord("pause-worker", "w0.1", at(5.0), at(11.9))]
    verdict = check(h)
    assert verdict.ok, verdict.violations
    assert verdict.duplicates[0].earlier.worker == "w0.1"


def test_etcd_faults_do_not_explain_duplicates() -> None:
    h = history()
    h.executions.append(run("t-a", 2, 9.0, 5, worker="w1.1"))
    h.faults = [FaultRecord("kill-etcd-leader", "etcd0", at(5), at(9))]
    assert "duplicates_explained" in problems(h)


def test_token_going_back_is_caught() -> None:
    h = history()
    h.submits.append(submit("e", 8, "t-e"))
    h.executions.append(run("t-e", 1, 8.05, 8))
    # t-a fired at 5 s with token 10; t-e fires later in the same partition with token 9.
    h.tasks.append(row("t-e", "e", 8, by="node-2", token=9))
    h.owners.append(OwnerEvent(at(1), 0, "node-2", 9))
    found = problems(h)
    assert list(found) == ["fencing"]
    assert "token 9 after" in found["fencing"][0]


def test_token_fired_by_a_node_etcd_did_not_give_it_to_is_caught() -> None:
    h = history()
    h.tasks = [dataclasses.replace(r, fired_by="node-1") if r.id == "t-a" else r
               for r in h.tasks]
    assert "etcd issued token 10 to node-0" in problems(h)["fencing"][0]


def test_slow_failover_is_caught() -> None:
    h = history()
    # node-0 is killed at 4.9 s; t-a (its partition, due at 5 s) fires 4 s late.
    h.faults = [FaultRecord("kill-node", "node-0", at(4.9), at(10))]
    h.tasks = [dataclasses.replace(r, fired_at_us=at(9), fired_by="node-1", fire_token=12)
               if r.id == "t-a" else r for r in h.tasks]
    h.owners.append(OwnerEvent(at(8.9), 0, "node-1", 12))
    h.fences[0] = 12
    h.executions[0] = run("t-a", 1, 9.05, 5)
    found = problems(h)
    assert list(found) == ["failover_gaps"]
    gap = check(h).gaps[0]
    assert gap.gap_s is not None and abs(gap.gap_s - 4.0) < 1e-6 and not gap.ok
    # Within TTL + tick + slack it passes.
    h.tasks = [dataclasses.replace(r, fired_at_us=at(7.5)) if r.id == "t-a" else r
               for r in h.tasks]
    h.executions[0] = run("t-a", 1, 7.55, 5)
    assert check(h).ok


def test_history_round_trips_through_json() -> None:
    h = history()
    h.faults = [FaultRecord("clock-jump", "node-0", at(3), at(10), {"offset_ms": -1000})]
    again = History.from_json(h.to_json())
    assert again == h


def test_fired_at_of_a_clock_jumped_node_is_corrected_only_while_it_was_skewed() -> None:
    from chronoq.chaos.checker import fire_lateness

    h = history()
    h.faults = [FaultRecord("clock-jump", "node-0", at(3), at(10), {"offset_ms": 3000})]
    h.owners += [
        OwnerEvent(at(3.0), 0, None, None),  # the old incarnation stops
        OwnerEvent(at(3.1), 0, "node-0", 20),  # the skewed one claims
        OwnerEvent(at(9.0), 0, None, None),  # ... and stops
        OwnerEvent(at(9.2), 0, "node-0", 21),  # the clean one claims inside the window
    ]
    h.fences[0] = 21
    h.submits += [submit("s", 5, "t-s"), submit("n", 12, "t-n")]
    h.executions += [run("t-s", 1, 5.1, 5), run("t-n", 1, 12.1, 12)]
    h.tasks += [row("t-s", "s", 5, fired=8.02, token=20), row("t-n", "n", 12, token=21)]
    verdict = check(h)
    assert verdict.ok, verdict.violations
    late = dict(fire_lateness(h))
    assert abs(late[at(5)] - 0.02) < 1e-6  # 8.02 by its clock, 5.02 really
    assert abs(late[at(12)] - 0.02) < 1e-6  # not corrected: fired after the jump ended


# ---------------------------------------------------------------------- execution gaps


def steady(h: History, start: float, end: float, *, every: float = 0.1) -> None:
    """Tasks due every ``every`` seconds in [start, end), each started 20 ms after its run_at."""
    n = round((end - start) / every)
    for i in range(n):
        due = start + i * every
        key, tid = f"s{i}", f"t-s{i}"
        h.submits.append(submit(key, due, tid))
        h.executions.append(run(tid, 1, due + 0.02, due))
        h.tasks.append(row(tid, key, due))


def test_execution_gaps_are_stretches_with_a_due_task_and_no_start() -> None:
    from chronoq.chaos.checker import execution_gaps

    h = history()
    h.executions = [run("t-a", 1, 5.05, 5), run("t-b", 1, 9.0, 6), run("t-x", 1, 9.5, 9.2)]
    # t-b is due at 6 s and waits until 9 s; after t-a started at 5.05 nothing starts.
    assert execution_gaps(h) == [(at(5), at(5.05)), (at(6), at(9)), (at(9.2), at(9.5))]


def test_a_worker_stall_during_a_node_freeze_is_caught() -> None:
    h = history()
    h.params = dataclasses.replace(h.params, partitions=1)
    h.submits, h.executions, h.tasks, h.cancels = [], [], [], []
    steady(h, 1, 4)
    # Everything due from 4 s on started only at 10 s: the workers were stuck in calls to
    # the frozen node although the other nodes fired.
    for i in range(80):
        due = 4 + i * 0.1
        key, tid = f"f{i}", f"t-f{i}"
        h.submits.append(submit(key, due, tid))
        h.executions.append(run(tid, 1, max(10.0, due + 0.02), due))
        h.tasks.append(row(tid, key, due))
    h.faults = [FaultRecord("freeze-node", "node-1", at(4.5), at(5.5))]
    found = problems(h)
    assert list(found) == ["execution_gap"], found
    assert "no worker started a task for 6.0" in found["execution_gap"][0]
    gap = check(h).exec_gaps[0]
    assert gap.gap_s is not None and abs(gap.gap_s - 6.0) < 0.05 and not gap.ok
    assert check(h).figures["execution_gap_by_fault_kind"] == {"freeze-node": gap.gap_s}
    # The same stall around an etcd fault is reported, not bounded.
    h.faults = [FaultRecord("kill-etcd-leader", "etcd0", at(4.5), at(5.5))]
    verdict = check(h)
    assert "execution_gap" not in problems(h)
    assert verdict.exec_gaps[0].gap_s == gap.gap_s and verdict.exec_gaps[0].ok


def test_workers_that_keep_starting_through_a_freeze_pass() -> None:
    h = history()
    h.submits, h.executions, h.tasks, h.cancels = [], [], [], []
    steady(h, 1, 12)
    h.tasks = [dataclasses.replace(r, partition=0) for r in h.tasks]
    h.faults = [
        FaultRecord("freeze-node-past-ttl", "node-1", at(3), at(6.5)),
        FaultRecord("kill-node", "node-1", at(7), at(10)),
    ]
    verdict = check(h)
    assert verdict.ok, verdict.violations
    assert [round(g.gap_s or 0, 6) for g in verdict.exec_gaps] == [0.02, 0.02]
    assert round(verdict.figures["max_execution_gap_s"], 6) == 0.02


def test_an_old_pause_node_history_is_judged_as_a_freeze_past_ttl() -> None:
    h = history()
    h.faults = [FaultRecord("pause-node", "node-0", at(5.01), at(9))]
    h.executions[1:] = [run("t-b", 1, 9.0, 6, outcome=ERROR), run("t-b", 2, 9.1, 7.0, worker="w1.1")]
    found = problems(h)
    assert list(found) == ["execution_gap"], found  # t-b waited from 6 s to 9 s


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), min_size=1, max_size=30))
def test_execution_gaps_match_a_brute_force_scan(waits: list[tuple[int, int]]) -> None:
    """Whole seconds: a second [t, t+1) is idle-but-due when some task is due by t and starts
    at t+1 or later; a start at an inner boundary ends a stretch."""
    from chronoq.chaos.checker import execution_gaps

    h = history()
    h.submits, h.tasks = [], []
    h.executions = [run(f"t{i}", 1, due + wait, due) for i, (due, wait) in enumerate(waits)]
    starts = {due + wait for due, wait in waits}
    longest = current = 0
    for t in range(max(starts) + 1):
        if t in starts:
            current = 0
        if any(due <= t < due + wait for due, wait in waits):
            current += 1
            longest = max(longest, current)
        else:
            current = 0
    found = [(e - b) / S for b, e in execution_gaps(h)]
    assert max(found, default=0) == longest


def test_nodes_that_check_their_clock_get_no_excuse_beyond_the_bound() -> None:
    """Since nodes hand off when their clock is off by more than 500 ms, a run 1 s early
    during a 3 s jump is a violation; older histories (no bound recorded) excuse it."""
    h = history()
    h.executions[0] = run("t-a", 1, 4.0, 5)  # 1 s early
    h.faults = [FaultRecord("clock-jump", "node-0", at(3), at(10), {"offset_ms": 3000})]
    assert check(h).ok  # an older history: the node trusted its clock
    h.meta["max_clock_offset_ms"] = 500
    assert "1000.0 ms before" in problems(h)["none_early"][0]
    h.executions[0] = run("t-a", 1, 4.7, 5)  # 300 ms early: within the bound
    verdict = check(h)
    assert verdict.ok, verdict.violations
    assert verdict.figures["early_under_clock_jump"] == 1


def stacked_on_a_shard_outage(fired: float, *, shard: list[int]) -> History:
    """node-0 (owner of partition 0) is killed at 4.9 s; t-a (partition 0, due at 5 s) cannot
    be taken over while the shard holding ``shard`` is down from 5.5 s to 12 s."""
    h = history()
    h.faults = [
        FaultRecord("kill-node", "node-0", at(4.9), at(10)),
        FaultRecord("kill-shard-primary", "shard-1", at(5.5), at(12), {"partitions": shard}),
    ]
    h.tasks = [dataclasses.replace(r, fired_at_us=at(fired), fired_by="node-1", fire_token=12)
               if r.id == "t-a" else r for r in h.tasks]
    h.owners.append(OwnerEvent(at(7.0), 0, "node-1", 12))
    h.fences[0] = 12
    h.executions[0] = run("t-a", 1, fired + 0.05, 5)
    return h


def test_a_node_fault_stacked_on_a_shard_outage_counts_from_its_heal() -> None:
    h = stacked_on_a_shard_outage(13.0, shard=[0])  # 8 s after its due time, 1 s after heal
    verdict = check(h)
    assert verdict.checks["failover_gaps"], verdict.violations
    assert verdict.gaps[0].gap_s is not None and abs(verdict.gaps[0].gap_s - 1.0) < 1e-6


def test_a_slow_failover_after_the_shard_heals_is_still_caught() -> None:
    found = problems(stacked_on_a_shard_outage(16.0, shard=[0]))  # 4 s after the heal
    assert [d.split(":")[0] for d in found["failover_gaps"]] == ["kill-node node-0"]
    assert "fired 4.00 s late" in found["failover_gaps"][0]


def test_an_outage_of_another_shard_excuses_nothing() -> None:
    found = problems(stacked_on_a_shard_outage(13.0, shard=[1]))  # partition 0 was not on it
    assert [d.split(":")[0] for d in found["failover_gaps"]] == ["kill-node node-0"]


def test_an_outage_that_begins_after_the_task_was_late_excuses_nothing() -> None:
    h = stacked_on_a_shard_outage(13.0, shard=[0])
    h.faults[1] = dataclasses.replace(h.faults[1], start_us=at(8.5))  # t-a late since 8.05 s
    assert [d.split(":")[0] for d in problems(h)["failover_gaps"]] == ["kill-node node-0"]
