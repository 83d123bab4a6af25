"""The chaos checker on synthetic histories: it passes a clean one and catches each fault
it exists to catch (a lost task, an early run, an unexplained duplicate, a stale token, a
slow failover), while excusing what an injected fault explains."""

from __future__ import annotations

import dataclasses

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
