"""Which rows from before routing need a route, and which schedules move home (pure)."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from chronoq.routing import key_partition
from chronoq.store.legacy import rehoming, routes_needed

P = 16


@given(st.lists(st.tuples(st.text(max_size=8), st.text(min_size=1, max_size=12)), max_size=40))
def test_a_route_is_recorded_exactly_for_keys_that_route_away_from_their_row(
    keyed: list[tuple[str, str]],
) -> None:
    rows = [(uuid.uuid4(), ns, key, i % P) for i, (ns, key) in enumerate(keyed)]
    needed = routes_needed(rows, P)
    expected = [
        (task_id, key_partition(ns, key, P), ns, key, p)
        for task_id, ns, key, p in rows
        if key_partition(ns, key, P) != p
    ]
    assert needed == expected


def test_schedules_already_home_stay() -> None:
    home = key_partition("ns", "nightly", P)
    away = (home + 1) % P
    a, b = uuid.uuid4(), uuid.uuid4()
    assert rehoming([(a, "ns", "nightly", home), (b, "ns", "nightly", away)], P) == [
        (b, home, away)
    ]
