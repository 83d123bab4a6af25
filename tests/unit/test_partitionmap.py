"""The partition map the node hands to ownership and the depth gauges."""

from __future__ import annotations

import pytest

from chronoq.buckets import MAX_PARTITIONS
from chronoq.partitionmap import PartitionMap


def test_all_is_every_partition_in_order() -> None:
    assert list(PartitionMap(4).all) == [0, 1, 2, 3]
    assert len(PartitionMap(MAX_PARTITIONS).all) == MAX_PARTITIONS


@pytest.mark.parametrize("count", [0, -1, MAX_PARTITIONS + 1])
def test_a_count_outside_the_stored_range_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="partitions must be between 1 and"):
        PartitionMap(count)
