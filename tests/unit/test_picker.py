"""The client's choice of node: round robin over the best, never stuck on a bad one."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from chronoq.client.picker import SUSPECT_SECONDS, NodeHealth, Picker

healths = st.sampled_from(list(NodeHealth))


def test_round_robin_over_healthy_nodes() -> None:
    picker = Picker(["a", "b", "c"])
    for i in range(3):
        picker.set_health(i, NodeHealth.SERVING)
    assert [picker.pick(0.0) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_a_node_that_is_not_serving_or_unreachable_gets_no_calls_until_it_recovers() -> None:
    picker = Picker(["a", "b", "c"])
    for i in range(3):
        picker.set_health(i, NodeHealth.SERVING)
    picker.set_health(1, NodeHealth.NOT_SERVING)
    picker.set_health(2, NodeHealth.UNREACHABLE)
    assert {picker.pick(0.0) for _ in range(10)} == {0}
    picker.set_health(2, NodeHealth.SERVING)
    assert {picker.pick(0.0) for _ in range(10)} == {0, 2}


def test_a_node_whose_call_failed_is_passed_over_for_a_while() -> None:
    picker = Picker(["a", "b"])
    picker.failed(0, now=10.0)
    assert {picker.pick(10.0 + SUSPECT_SECONDS / 2) for _ in range(4)} == {1}
    assert {picker.pick(10.0 + SUSPECT_SECONDS + 0.1) for _ in range(4)} == {0, 1}
    picker.failed(0, now=20.0)
    picker.answered(0)  # e.g. its health stream said SERVING again
    assert {picker.pick(20.0) for _ in range(4)} == {0, 1}


def test_when_every_node_looks_bad_the_least_bad_still_gets_the_call() -> None:
    picker = Picker(["a", "b"])
    picker.set_health(0, NodeHealth.UNREACHABLE)
    picker.set_health(1, NodeHealth.NOT_SERVING)
    assert picker.pick(0.0) == 1
    picker.failed(1, now=0.0)
    assert picker.pick(0.0) == 0


@given(
    st.lists(st.tuples(healths, st.booleans()), min_size=1, max_size=6),
    st.sets(st.integers(min_value=0, max_value=5)),
    st.integers(min_value=1, max_value=30),
)
def test_the_pick_is_among_the_best_allowed_nodes(
    nodes: list[tuple[NodeHealth, bool]], avoid: set[int], picks: int
) -> None:
    picker = Picker([f"n{i}" for i in range(len(nodes))])
    for i, (health, suspect) in enumerate(nodes):
        picker.set_health(i, health)
        if suspect:
            picker.failed(i, now=0.0)
    allowed = [i for i in range(len(nodes)) if i not in avoid] or list(range(len(nodes)))
    best = min((suspect, health) for i, (health, suspect) in enumerate(nodes) if i in allowed)
    best_nodes = [i for i in allowed if (nodes[i][1], nodes[i][0]) == best]
    chosen = Counter(picker.pick(1.0, avoid) for _ in range(picks * len(best_nodes)))
    assert set(chosen) == set(best_nodes)  # only the best, and every one of them
    assert set(chosen.values()) == {picks}  # evenly: round robin
