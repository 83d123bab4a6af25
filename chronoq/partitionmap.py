"""The partition map: the partitions a cluster's task space is cut into.

Pure, no I/O. The node builds it from its settings and hands it to what needs the partitions
(ownership, the depth gauges, the timing wheel), so the store is not where the node learns
them. Today it is the count ``P`` fixed when the cluster was created; with store shards it
also says which shard holds each partition (``chronoq.shardmap``).
"""

from __future__ import annotations

from dataclasses import dataclass

from chronoq.buckets import MAX_PARTITIONS


@dataclass(frozen=True)
class PartitionMap:
    """``count`` partitions, numbered ``0..count-1``."""

    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_PARTITIONS:
            raise ValueError(f"partitions must be between 1 and {MAX_PARTITIONS}, got {self.count}")

    @property
    def all(self) -> range:
        """Every partition, in order."""
        return range(self.count)
