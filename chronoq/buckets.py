"""Time buckets and hash partitions: where a task lives in the task space.

Pure functions, no I/O. A task's bucket is ``floor(run_at_seconds / bucket_seconds)``;
its partition is a stable hash of its id (never Python's ``hash()``, which is salted per
process), so every node computes the same place for the same task.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

DEFAULT_PARTITIONS = 256
#: Partitions are stored as a smallint.
MAX_PARTITIONS = 32767
DEFAULT_BUCKET_SECONDS = 60


def bucket_of(run_at: datetime, bucket_seconds: int = DEFAULT_BUCKET_SECONDS) -> int:
    """The bucket that holds ``run_at``; exact integer math on microseconds."""
    if run_at.tzinfo is None:
        raise ValueError("run_at must be timezone-aware")
    if bucket_seconds < 1:
        raise ValueError("bucket_seconds must be >= 1")
    micros = (run_at - _EPOCH) // timedelta(microseconds=1)
    return micros // (bucket_seconds * 1_000_000)


def bucket_start(bucket: int, bucket_seconds: int = DEFAULT_BUCKET_SECONDS) -> datetime:
    """The first instant of ``bucket``."""
    return _EPOCH + timedelta(seconds=bucket * bucket_seconds)


def partition_of(key: str | bytes, partitions: int = DEFAULT_PARTITIONS) -> int:
    """Stable partition of a key (a task id): first 8 bytes of BLAKE2b, modulo ``partitions``."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    data = key.encode() if isinstance(key, str) else key
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def average_per_bucket(
    pending: int, horizon_minutes: int = 1440, bucket_seconds: int = 60
) -> float:
    """Expected pending tasks per bucket when ``pending`` spread evenly over the horizon."""
    buckets = max(1, horizon_minutes * 60 // bucket_seconds)
    return pending / buckets


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
