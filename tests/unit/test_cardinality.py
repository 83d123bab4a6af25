"""Tenants choose queue names, not the number of series: the bound holds for any number."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.cardinality import OTHER, top_queues
from chronoq.errors import InvalidArgument
from chronoq.limits import check_name

STATES = ("READY", "RUNNING", "SCHEDULED")


def test_100_000_queues_keep_the_busiest_and_sum_the_rest() -> None:
    depth = {("ns", f"q{i}", "SCHEDULED"): 1 for i in range(100_000)}
    depth["ns", "hot", "READY"] = 50
    depth["ns", "hot", "SCHEDULED"] = 50
    bounded = top_queues(depth, 10)
    assert len({(ns, q) for ns, q, _ in bounded}) == 11  # ten of their own and ns/_other
    assert bounded["ns", "hot", "READY"] == 50 and bounded["ns", "hot", "SCHEDULED"] == 50
    assert sum(bounded.values()) == sum(depth.values())
    assert bounded["ns", OTHER, "SCHEDULED"] == 100_000 - 9


def test_many_namespaces_share_one_series_beyond_the_cap() -> None:
    depth = {(f"ns{i}", "q", "READY"): i for i in range(10_000)}
    bounded = top_queues(depth, 3)
    assert set(bounded) == {
        ("ns9999", "q", "READY"), ("ns9998", "q", "READY"), ("ns9997", "q", "READY"),
        (OTHER, OTHER, "READY"),
    }  # fmt: skip
    assert sum(bounded.values()) == sum(depth.values())


def test_under_the_cap_nothing_changes_and_a_tenant_cannot_name_the_aggregate() -> None:
    depth = {("a", "q", "READY"): 3, ("b", "q", "RUNNING"): 1}
    assert top_queues(depth, 2) == depth
    with pytest.raises(InvalidArgument):
        check_name("queue", OTHER)


@given(
    st.dictionaries(
        st.tuples(st.sampled_from("abcdef"), st.text("xyz", min_size=1, max_size=3),
                  st.sampled_from(STATES)),
        st.integers(0, 1000),
        max_size=300,
    ),
    st.integers(0, 20),
)
def test_the_bound_and_the_totals_hold_for_any_depth(
    depth: dict[tuple[str, str, str], int], cap: int
) -> None:
    bounded = top_queues(depth, cap)
    assert len({(ns, q) for ns, q, _ in bounded}) <= 2 * cap + 1
    assert sum(bounded.values()) == sum(depth.values())
    for state in STATES:
        assert sum(n for (_, _, s), n in bounded.items() if s == state) == sum(
            n for (_, _, s), n in depth.items() if s == state
        )
