"""The pieces of history ranges a shard lacks: disjoint from its slices, covering the rest."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from chronoq.history_slices import merged, uncovered

Range = tuple[datetime, datetime]

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


ranges = st.lists(
    st.tuples(st.integers(0, 200), st.integers(1, 60)).map(lambda r: (at(r[0]), at(r[0] + r[1]))),
    max_size=8,
)


def covers(rs: list[Range], t: datetime) -> bool:
    return any(lo <= t < hi for lo, hi in rs)


@given(ranges, ranges)
def test_the_pieces_fill_what_is_wanted_and_overlap_nothing(
    wanted: list[Range], existing: list[Range]
) -> None:
    pieces = uncovered(wanted, existing)
    for lo, hi in pieces:
        assert lo < hi
        assert not any(e_lo < hi and lo < e_hi for e_lo, e_hi in existing)  # no overlap
    for a, b in itertools.pairwise(pieces):
        assert a[1] <= b[0]  # sorted, disjoint
    for minute in range(0, 262):
        t = at(minute)
        if covers(wanted, t):
            assert covers(existing, t) or covers(pieces, t)  # nothing wanted left out
        if covers(pieces, t):
            assert covers(wanted, t)  # nothing unwanted made


@given(ranges)
def test_a_shard_that_has_the_slices_needs_nothing(existing: list[Range]) -> None:
    assert uncovered(existing, existing) == []
    assert uncovered(merged(existing), existing) == []


def test_a_day_wanted_over_hours_that_exist_gets_the_gaps_only() -> None:
    assert uncovered([(at(0), at(600))], [(at(60), at(120)), (at(120), at(180))]) == [
        (at(0), at(60)),
        (at(180), at(600)),
    ]
