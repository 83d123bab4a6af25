"""HealthWatch's decision: ownership AND every critical loop, with the reasons it logs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chronoq.node.housekeeping import HealthWatch


class FakeOwnership:
    def __init__(self) -> None:
        self.expected_set = {0, 1, 2}
        self.owned_map: dict[int, int] = {0: 1, 1: 1, 2: 1}
        self.suspended = False

    def expected(self) -> set[int]:
        return self.expected_set

    def owned(self) -> Mapping[int, int]:
        return self.owned_map


async def test_serving_needs_ownership_and_healthy_loops() -> None:
    own = FakeOwnership()
    loop_problems: list[str] = []
    changes: list[bool] = []

    async def set_serving(serving: bool) -> None:
        changes.append(serving)

    watch = HealthWatch(own, set_serving, loop_problems=lambda: list(loop_problems))  # type: ignore[arg-type]
    assert await watch.check() is True

    loop_problems.append("loop firing failing for 12 s (40 passes): StoreUnavailable")
    assert await watch.check() is False
    assert watch.problems() == loop_problems
    loop_problems.clear()
    assert await watch.check() is True

    own.owned_map = {}
    assert watch.problems() == ["owns none of the 3 partitions assigned to it"]
    own.owned_map = {1: 4}
    assert watch.healthy()  # part of its share is enough

    own.suspended = True
    assert await watch.check() is False
    assert "ownership suspended" in watch.problems()[0]
    assert changes == [True, False, True, False]  # set on changes only


async def test_a_node_with_nothing_to_own_is_healthy_when_its_loops_are() -> None:
    own: Any = FakeOwnership()
    own.expected_set = set()
    own.owned_map = {}

    async def set_serving(_serving: bool) -> None:
        pass

    assert HealthWatch(own, set_serving).healthy()
