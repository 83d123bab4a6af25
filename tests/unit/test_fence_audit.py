"""The fence audit's rule on a store that answers for some partitions only (a read over
shards that skipped one): only what was read is judged."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from chronoq.coordinator.fence_audit import audit_fences
from chronoq.store.rows import Fence


class PartlyAnswering:
    """Fences in memory; ``fences_of`` leaves out the partitions of an unanswering shard."""

    def __init__(self, fences: dict[int, Fence], silent: set[int]) -> None:
        self.stored = fences
        self.silent = silent
        self.taken: list[int] = []

    async def fences_of(self, partitions: Sequence[int]) -> dict[int, Fence | None]:
        return {p: self.stored.get(p) for p in partitions if p not in self.silent}

    async def take_fence(
        self, partition: int, token: int, cluster_id: str, owner: str
    ) -> Fence | None:
        self.taken.append(partition)
        old = self.stored.get(partition)
        if old is not None and old.cluster_id == cluster_id and old.token > token:
            return None
        self.stored[partition] = Fence(partition, token, 0, owner, cluster_id)
        return self.stored[partition]


def fence(partition: int, token: int) -> Fence:
    return Fence(partition, token, 0, "n0", "c")


async def test_a_partition_left_out_of_the_read_is_not_taken_for_a_lost_fence() -> None:
    store = PartlyAnswering({0: fence(0, 5), 1: fence(1, 4), 2: fence(2, 5)}, silent={2, 3})
    owned = {0: 5, 1: 5, 2: 5, 3: 5}
    assert await audit_fences(store, owned, "c", "n0") == {1}  # older: the store went back
    assert store.taken == [1]  # 2 and 3 were not read: nothing is known of their fences
    store.silent = set()
    assert await audit_fences(store, owned, "c", "n0") == {3}  # read now, and truly absent


@given(
    st.dictionaries(st.integers(0, 15), st.integers(1, 9)),
    st.dictionaries(st.integers(0, 15), st.integers(1, 9)),
    st.sets(st.integers(0, 15)),
)
async def test_the_audit_writes_only_where_the_store_answered(
    owned: dict[int, int], stored: dict[int, int], silent: set[int]
) -> None:
    store = PartlyAnswering({p: fence(p, t) for p, t in stored.items()}, silent)
    retaken = await audit_fences(store, owned, "c", "n0")
    assert not set(store.taken) & silent
    assert retaken == {p for p in owned if p not in silent and stored.get(p, 0) < owned[p]}
