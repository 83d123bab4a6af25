"""The pure parts of the grey chaos faults: link shaping, the clock drift's shape, their place
in the schedule, and how the checker judges what they may cause (nothing more)."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.chaos.checker import check, fire_lateness
from chronoq.chaos.drift import ACT_S, Drift
from chronoq.chaos.fault_plan import (
    ALL_KINDS,
    STORE_HA_KINDS,
    FaultKind,
    default_holds,
    parse_kinds,
    schedule,
)
from chronoq.chaos.history import FaultRecord
from chronoq.chaos.shaping import LinkShape, Shaper, lifetime
from chronoq.node.clock_file import parse_offset
from tests.unit.test_checker import at, clean, problems, row, run, submit

NEW = {FaultKind.DISK_FULL, FaultKind.SLOW_LINKS_ETCD, FaultKind.SLOW_LINKS_POSTGRES,
       FaultKind.CLOCK_DRIFT}

# ---------------------------------------------------------------------- link shaping


@given(
    chunks=st.lists(st.tuples(st.floats(0, 0.05), st.integers(1, 64 * 1024)), min_size=1,
                    max_size=50),
    seed=st.integers(0, 1000),
)
def test_shaped_chunks_arrive_in_order_never_before_latency_and_bandwidth_allow(
    chunks: list[tuple[float, int]], seed: int
) -> None:
    shape = LinkShape(latency_s=0.03, jitter_s=0.02, bandwidth_bps=256 * 1024, mean_life_s=None)
    shaper = Shaper(shape, random.Random(seed))
    now, last, sent_bytes = 0.0, 0.0, 0
    for gap, nbytes in chunks:
        now += gap
        sent_bytes += nbytes
        at_ = shaper.delivery(now, nbytes)
        assert at_ >= last  # in order
        assert at_ >= now + nbytes / shape.bandwidth_bps + (shape.latency_s - shape.jitter_s)
        # The cap: everything given so far cannot have crossed the link faster than its rate.
        assert at_ >= sent_bytes / shape.bandwidth_bps
        assert at_ <= max(now, last) + nbytes / shape.bandwidth_bps + 0.05 + 1e-9 or at_ == last
        last = at_


def test_a_burst_waits_for_the_bandwidth_cap() -> None:
    shape = LinkShape(latency_s=0.0, jitter_s=0.0, bandwidth_bps=100_000, mean_life_s=None)
    shaper = Shaper(shape, random.Random(1))
    times = [shaper.delivery(0.0, 10_000) for _ in range(10)]
    assert times == pytest.approx([0.1 * (i + 1) for i in range(10)])


def test_connection_lifetimes_are_seeded_and_absent_without_resets() -> None:
    shape = LinkShape(mean_life_s=8.0)
    draws = [lifetime(shape, random.Random(3)) for _ in range(2)]
    assert draws[0] == draws[1] and draws[0] is not None and draws[0] > 0
    lives = [lifetime(shape, r) for r in [random.Random(7)] * 2000]
    assert 6.0 < sum(x for x in lives if x is not None) / len(lives) < 10.0
    assert lifetime(LinkShape(mean_life_s=None), random.Random(1)) is None


@pytest.mark.parametrize("bad", [{"latency_s": -1}, {"bandwidth_bps": 0}, {"mean_life_s": 0}])
def test_a_link_shape_refuses_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LinkShape(**bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- clock drift


def test_a_drift_rises_to_its_peak_and_slews_back() -> None:
    d = Drift(1000, rise_s=20, fall_s=10)
    assert [d.offset_ms(t) for t in (-1, 0, 10, 20, 25, 30, 31)] == [0, 0, 500, 1000, 500, 0, 0]
    assert d.rate_ms_per_s == 50
    assert Drift(-1000, rise_s=20, fall_s=10).offset_ms(10) == -500


def test_a_drift_excuses_the_bound_plus_one_measurement_interval_of_drift() -> None:
    d = Drift(1000, rise_s=20, fall_s=10)
    assert d.excusable_ms(500, 2.0) == 500 + 50 * (2.0 + ACT_S)
    assert d.excusable_ms(None, 2.0) == 1000  # nodes that do not check: the whole drift
    assert Drift(300, rise_s=20, fall_s=10).excusable_ms(500, 2.0) == 300  # never past it
    with pytest.raises(ValueError):
        Drift(1000, rise_s=0, fall_s=1)


def test_the_node_reads_its_offset_file_or_refuses_it() -> None:
    assert parse_offset(b"-250\n") == timedelta(milliseconds=-250)
    assert parse_offset(b"") == timedelta(0)
    assert parse_offset(b"soon") is None
    assert parse_offset(b"1" * 100) is None


# ---------------------------------------------------------------------- the schedule


def test_all_has_the_grey_faults_and_a_replicated_store_has_no_disk_full() -> None:
    assert NEW <= set(parse_kinds("all"))
    replicated = set(parse_kinds("all", replicated=True))
    assert FaultKind.DISK_FULL not in replicated
    assert FaultKind.RESTART_POSTGRES not in replicated
    assert set(STORE_HA_KINDS) <= replicated
    assert NEW - {FaultKind.DISK_FULL} <= replicated


def test_a_long_schedule_plays_each_grey_fault_with_its_hold() -> None:
    holds = default_holds(2, 4)
    plan = schedule(ALL_KINDS, 600, seed=23, holds=holds)
    assert NEW <= {p.kind for p in plan}
    drifts = [p for p in plan if p.kind is FaultKind.CLOCK_DRIFT]
    assert all(p.variant in "+-" and p.variant for p in drifts)
    assert all(p.hold == holds[p.kind] for p in plan)


# ---------------------------------------------------------------------- the checker


def drift_fault(peak_ms: int, start: float = 3.0, end: float = 33.0) -> FaultRecord:
    return FaultRecord("clock-drift", "node-0", at(start), at(end),
                       {"peak_ms": peak_ms, "rise_s": 20.0, "fall_s": 10.0,
                        "check_interval_s": 2.0})


def test_an_early_run_during_a_drift_is_excused_up_to_what_the_clock_check_allows() -> None:
    h = clean()
    h.meta["max_clock_offset_ms"] = 500
    h.executions[0] = run("t-a", 1, 4.4, 5)  # 600 ms early: within 500 + 50 x 3 ms
    h.faults = [drift_fault(1000)]
    verdict = check(h)
    assert verdict.ok, verdict.violations
    assert verdict.figures["early_under_clock_jump"] == 1
    h.executions[0] = run("t-a", 1, 4.2, 5)  # 800 ms: the node should have stopped by then
    assert "none_early" in problems(h)


def test_a_clock_drifting_behind_excuses_no_early_run() -> None:
    h = clean()
    h.meta["max_clock_offset_ms"] = 500
    h.executions[0] = run("t-a", 1, 4.6, 5)
    h.faults = [drift_fault(-1000)]
    assert "none_early" in problems(h)


@pytest.mark.parametrize(("kind", "explained"), [
    ("disk-full", True), ("slow-links-postgres", True), ("clock-drift", True),
    ("slow-links-etcd", False),
])
def test_which_grey_faults_explain_a_duplicate(kind: str, explained: bool) -> None:
    h = clean()
    h.executions.append(run("t-a", 2, 9.0, 5, worker="w1.1"))
    h.tasks[0] = row("t-a", "a", 5, attempt=2)
    target = "node-0" if kind == "clock-drift" else ("postgres" if kind == "disk-full"
                                                     else "all nodes")
    h.faults = [FaultRecord(kind, target, at(6), at(8), {})]
    found = problems(h)
    assert ("duplicates_explained" not in found) is explained, found


def test_what_a_drifting_node_wrote_as_fired_at_is_corrected_by_the_drift() -> None:
    h = clean()
    h.faults = [drift_fault(1000, start=0.0)]
    # node-0 fired t-a at 5.02 s real time, 250 ms ahead by then: it wrote 5.27 s.
    h.tasks[0] = row("t-a", "a", 5, fired=5.27)
    late = dict(fire_lateness(h))
    assert late[at(5)] == pytest.approx(0.02, abs=0.005)


def test_a_partition_of_a_disk_full_store_is_judged_from_the_heal() -> None:
    h = clean()
    h.faults = [FaultRecord("disk-full", "postgres", at(4), at(12), {})]
    h.submits.append(submit("d", 6, "t-d"))
    h.executions.append(run("t-d", 1, 12.6, 6))
    h.tasks.append(row("t-d", "d", 6, fired=12.5))  # fired 0.5 s after the space came back
    verdict = check(h)
    assert verdict.ok, verdict.violations
    h.tasks[-1] = row("t-d", "d", 6, fired=16.5)  # 4.5 s after: past TTL + tick + slack
    assert "failover_gaps" in problems(h)


async def test_the_node_clock_follows_its_offset_file(tmp_path: Path) -> None:
    import asyncio

    from chronoq.clock import OffsetClock
    from chronoq.node.clock_file import follow

    path = tmp_path / "node-0.clock-offset"
    clock = OffsetClock(timedelta(milliseconds=100))
    task = asyncio.create_task(follow(clock, path, timedelta(milliseconds=100)))
    try:
        await asyncio.sleep(0.05)
        assert clock.offset == timedelta(milliseconds=100)  # no file: the base alone
        path.write_text("250\n")
        for _ in range(50):  # bounded: it rereads every 100 ms
            if clock.offset == timedelta(milliseconds=350):
                break
            await asyncio.sleep(0.05)
        assert clock.offset == timedelta(milliseconds=350)
        path.write_text("garbage")
        await asyncio.sleep(0.3)
        assert clock.offset == timedelta(milliseconds=350)  # kept, not reset to a guess
    finally:
        task.cancel()
