"""The etcd lease TTL of a node: one default and one range for every way of running nodes. Pure.

etcd raises a shorter lease to its own minimum (about 2 s with its default election timeout),
so a TTL of 1 would not mean what it says; past 5 minutes a dead node holds its partitions too
long to be useful.
"""

from __future__ import annotations

from chronoq.errors import ConfigError

DEFAULT_LEASE_TTL = 5
"""Seconds of silence before a node's partitions move to the others."""
MIN_LEASE_TTL = 2
MAX_LEASE_TTL = 300


def check_lease_ttl(seconds: int) -> int:
    """Return ``seconds`` if it is a usable lease TTL, else raise ``ConfigError``."""
    if not MIN_LEASE_TTL <= seconds <= MAX_LEASE_TTL:
        raise ConfigError(
            f"lease TTL must be between {MIN_LEASE_TTL} and {MAX_LEASE_TTL} s, got {seconds}"
        )
    return seconds
