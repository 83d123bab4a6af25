"""Time buckets and hash partitions: where a task lives in the task space.

Pure functions, no I/O. A task's bucket is ``floor(run_at_seconds / bucket_seconds)``;
its partition is a stable hash of its id (never Python's ``hash()``, which is salted per
process), so every node computes the same place for the same task.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

DEFAULT_PARTITIONS = 256
#: Partitions are stored as a smallint.
MAX_PARTITIONS = 32767
DEFAULT_BUCKET_SECONDS = 60


def bucket_of(run_at: datetime, bucket_seconds: int = DEFAULT_BUCKET_SECONDS) -> int:
    """The bucket that holds ``run_at``; exact integer math on microseconds."""
    return buckets_of((run_at,), bucket_seconds)[0]


def buckets_of(
    run_ats: Iterable[datetime], bucket_seconds: int = DEFAULT_BUCKET_SECONDS
) -> list[int]:
    """``bucket_of`` of many instants (a submitted batch), the width checked once."""
    if bucket_seconds < 1:
        raise ValueError("bucket_seconds must be >= 1")
    width = bucket_seconds * 1_000_000
    out = []
    for run_at in run_ats:
        if run_at.tzinfo is None:
            raise ValueError("run_at must be timezone-aware")
        out.append((run_at - _EPOCH) // _MICROSECOND // width)
    return out


def bucket_start(bucket: int, bucket_seconds: int = DEFAULT_BUCKET_SECONDS) -> datetime:
    """The first instant of ``bucket``."""
    return _EPOCH + timedelta(seconds=bucket * bucket_seconds)


def partition_of(key: str | bytes, partitions: int = DEFAULT_PARTITIONS) -> int:
    """Stable partition of a key (a task id): first 8 bytes of BLAKE2b, modulo ``partitions``."""
    return partitions_of((key.encode() if isinstance(key, str) else key,), partitions)[0]


def partitions_of(keys: Iterable[bytes], partitions: int = DEFAULT_PARTITIONS) -> list[int]:
    """``partition_of`` of many ids given as bytes, the partition count checked once."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    digest = hashlib.blake2b
    return [int.from_bytes(digest(k, digest_size=8).digest(), "big") % partitions for k in keys]


def average_per_bucket(
    pending: int, horizon_minutes: int = 1440, bucket_seconds: int = 60
) -> float:
    """Expected pending tasks per bucket when ``pending`` spread evenly over the horizon."""
    buckets = max(1, horizon_minutes * 60 // bucket_seconds)
    return pending / buckets


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
