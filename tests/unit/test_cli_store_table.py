"""``chronoq store shards``: its counts are right-aligned, names and lists left (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from chronoq.cli.store import _shards_table
from chronoq.client.values import ClusterStatus, ShardMapStatus, ShardStatus


def test_the_counts_of_the_shards_table_are_right_aligned() -> None:
    shard = ShardStatus("shard-0", "postgresql://chronoq:***@db/chronoq", "ok", "0-255", 256, 7)
    cluster = ClusterStatus(
        "c", "n1", datetime(2024, 1, 1, tzinfo=UTC), 256, 60,
        shard_map=ShardMapStatus(version=1, shards=[shard]),
    )
    justify = {str(c.header): c.justify for c in _shards_table(cluster).columns}
    assert justify == {
        "shard": "left", "dsn": "left", "health": "left", "partitions": "left",
        "held": "right", "pending (counted buckets)": "right",
    }
