"""Token buckets. Pure: the caller passes the time, so tests need no sleeping.

Submit quotas use one bucket per namespace on each node and *refuse* what exceeds it
(RESOURCE_EXHAUSTED with a retry hint), since a node must not hold requests hostage.
Cluster-wide queue dispatch limits live in the store instead (one row per queue, updated
atomically by whichever node serves the claim); see ``queries.sql`` ``take_tokens``.

Schedule-made tasks count too: a schedule reserves its maximum rate (``schedule_rate``) of
its namespace's quota when it is created or resumed, and the active schedules of a namespace
together may not reserve more than the quota. Each occurrence is then also charged, when its
owner makes it, to the namespace's bucket on that node (the same bucket as submits): creating
and deleting schedules in a loop makes no more than the quota either. An occurrence the bucket
cannot pay yet is made on a later pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from chronoq.recurrence import Cron, Rule

#: Cron has five fields: a minute is its finest unit, so it fires at most once a minute.
CRON_FINEST = timedelta(minutes=1)


def schedule_rate(rule: Rule) -> float:
    """The most tasks per second ``rule`` can make: what it reserves of the submit quota."""
    every = CRON_FINEST if isinstance(rule, Cron) else rule.interval
    return 1.0 / max(every.total_seconds(), 1e-3)


@dataclass
class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` banked."""

    rate: float
    burst: float
    tokens: float = field(default=-1.0)
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def take(self, n: float, now: float) -> bool:
        """Take ``n`` tokens if all are there; nothing is taken otherwise."""
        self._refill(now)
        if n <= self.tokens:
            self.tokens -= n
            return True
        return False

    def wait_time(self, n: float, now: float) -> float:
        """Seconds until ``n`` tokens would be there (inf if ``n`` exceeds the burst)."""
        self._refill(now)
        if n > self.burst:
            return float("inf")
        return max(0.0, (n - self.tokens) / self.rate)


class Quotas:
    """One bucket per key (namespace), created on first use with the same rate and burst."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, key: str, n: float, now: float) -> float | None:
        """None if granted, else the seconds to wait before asking again."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, updated=now)
        if bucket.take(n, now):
            return None
        return bucket.wait_time(n, now)

    def available(self, key: str, now: float) -> int:
        """Whole tokens ``key`` holds now (a new key: the full burst)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return int(self.burst)
        bucket._refill(now)
        return int(bucket.tokens)
