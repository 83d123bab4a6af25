"""A bound on metric label sets that tenants choose. Pure.

Queue and namespace names are the tenants': exported one series each, 100,000 queues made
100,000 series and a /metrics of 18 MB that every scrape rendered again. ``top_queues``
keeps the busiest ``cap`` (namespace, queue) pairs as they are and adds every other pair into
(namespace, ``OTHER``), or into (``OTHER``, ``OTHER``) when its namespace kept no pair: at
most ``2 * cap + 1`` pairs, however many queues exist. Totals are kept exactly.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping

#: The label value of what is aggregated: a name no tenant can create (parentheses are not
#: among ``chronoq.limits.NAME_CHARACTERS``).
OTHER = "(other)"

#: (namespace, queue) pairs with series of their own, by default, and at most: a queue's
#: depth is three series (one per state), and /metrics stays a few megabytes at the bound.
DEFAULT_METRICS_QUEUES = 200
MAX_METRICS_QUEUES = 10_000


def top_queues(
    depth: Mapping[tuple[str, str, str], int], cap: int
) -> dict[tuple[str, str, str], int]:
    """``depth`` ((namespace, queue, state) → tasks) with at most ``cap`` pairs of its own.

    The busiest pairs (most tasks, all states together; ties by name, so the choice is
    stable) keep their series; the rest are summed per namespace, or into one series when
    their namespace kept none.
    """
    if cap < 0:
        raise ValueError("cap must be >= 0")
    totals: Counter[tuple[str, str]] = Counter()
    for (ns, queue, _state), n in depth.items():
        totals[ns, queue] += n
    if len(totals) <= cap:
        return dict(depth)
    kept = set(heapq.nsmallest(cap, totals, key=lambda pair: (-totals[pair], pair)))
    kept_namespaces = {ns for ns, _queue in kept}
    out: Counter[tuple[str, str, str]] = Counter()
    for (ns, queue, state), n in depth.items():
        if (ns, queue) in kept:
            out[ns, queue, state] += n
        elif ns in kept_namespaces:
            out[ns, OTHER, state] += n
        else:
            out[OTHER, OTHER, state] += n
    return dict(out)
