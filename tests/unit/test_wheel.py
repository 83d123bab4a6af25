"""Properties of the timing wheel: never early, bounded, forgets moved partitions, and takes a
clock that jumps both ways (the virtual clock) in its stride."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronoq.wheel import COMPACT_FACTOR, TimingWheel


@dataclass(frozen=True)
class Add:
    task: int
    partition: int
    at: int


@dataclass(frozen=True)
class Pop:
    now: int  # the clock's reading: any value, so it may jump back as well as forward
    limit: int | None


@dataclass(frozen=True)
class Drop:
    partitions: frozenset[int]


instants = st.integers(min_value=-1_000, max_value=1_000)
ops = st.lists(
    st.one_of(
        st.builds(Add, st.integers(0, 60), st.integers(0, 7), instants),
        st.builds(Pop, instants, st.one_of(st.none(), st.integers(1, 5))),
        st.builds(Drop, st.frozensets(st.integers(0, 7), max_size=3)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, capacity=st.integers(1, 40))
def test_never_early_never_twice_never_a_dropped_partition(ops: list[object], capacity: int) -> None:
    wheel = TimingWheel(capacity)
    held: dict[str, tuple[int, int]] = {}  # the model: task → (partition, instant)
    for op in ops:
        if isinstance(op, Add):
            key = f"t{op.task}"
            accepted = wheel.add(key, op.partition, op.at)
            assert accepted == (key in held or len(held) < capacity)
            if accepted:
                held[key] = (op.partition, op.at)
        elif isinstance(op, Pop):
            popped = wheel.pop_due(op.now, op.limit)
            due = sorted(at for _p, at in held.values() if at <= op.now)
            assert [d.at for d in popped] == due[: len(popped)]  # earliest first
            assert all(d.at <= op.now for d in popped)  # never before its instant
            assert len(popped) == (len(due) if op.limit is None else min(op.limit, len(due)))
            for d in popped:
                assert held.pop(d.task_id) == (d.partition, d.at)  # held, and only once
        elif isinstance(op, Drop):
            dropped = wheel.drop_partitions(op.partitions)
            gone = [k for k, (p, _at) in held.items() if p in op.partitions]
            assert dropped == len(gone)
            for k in gone:
                del held[k]
        assert len(wheel) == len(held) <= capacity
        assert wheel.free == capacity - len(held)
        assert wheel.next_at() == min((at for _p, at in held.values()), default=None)
        assert len(wheel._heap) <= COMPACT_FACTOR * max(len(held), capacity // 16, 64) + 1
    # Whatever is left fires once the clock reaches it, and nothing else does.
    rest = wheel.pop_due(10**9)
    assert sorted((d.task_id, d.partition, d.at) for d in rest) == sorted(
        (k, p, at) for k, (p, at) in held.items()
    )
    assert len(wheel) == 0 and wheel.next_at() is None


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(st.tuples(st.integers(0, 3), instants), min_size=1, max_size=50),
    jumps=st.lists(instants, min_size=1, max_size=20),
)
def test_a_clock_that_jumps_back_gets_nothing_until_it_catches_up(
    entries: list[tuple[int, int]], jumps: list[int]
) -> None:
    wheel = TimingWheel()
    for i, (partition, at) in enumerate(entries):
        wheel.add(f"t{i}", partition, at)
    fired: list[int] = []
    for now in jumps:  # forward and back, as a virtual clock may go
        batch = wheel.pop_due(now)
        assert all(d.at <= now for d in batch)
        fired += [d.at for d in batch]
    assert len(fired) + len(wheel) == len(entries)
    # Everything due by the latest reading fired then; nothing later did.
    assert sorted(fired) == sorted(at for _p, at in entries if at <= max(jumps))


def test_re_adding_moves_a_task_and_holds_it_once() -> None:
    wheel = TimingWheel(2)
    assert wheel.add("a", 1, 100)
    assert wheel.add("a", 1, 50)  # re-timed: held once, at the new instant
    assert len(wheel) == 1 and wheel.next_at() == 50
    assert wheel.add("b", 2, 70)
    assert not wheel.add("c", 2, 10)  # full: refused, the tick fires it
    assert wheel.refused == 1
    assert [d.task_id for d in wheel.pop_due(100)] == ["a", "b"]


def test_keep_partitions_and_discard() -> None:
    wheel = TimingWheel()
    for i in range(10):
        wheel.add(f"t{i}", i % 3, i)
    assert wheel.keep_partitions({0, 1}) == 3
    assert wheel.partitions() == {0, 1}
    assert wheel.discard(["t0", "t1", "nope"]) == 2
    assert [d.task_id for d in wheel.pop_due(100)] == ["t3", "t4", "t6", "t7", "t9"]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        TimingWheel(0)
