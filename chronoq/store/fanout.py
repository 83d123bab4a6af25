"""How a store of shards puts the answers of its shards back together. Pure, no I/O.

A call that spans shards is one statement per shard; each answer is whole for that shard's
partitions, and these functions merge them into the answer one store would have given:
fires and their effects added up, keyset pages cut where the first shard's page ended,
counts summed, per-item outcomes put back in the caller's order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

from chronoq.models import Page, QueueCount, QueueCounts, Task, TaskState
from chronoq.store.rows import FireResult

T = TypeVar("T")
K = TypeVar("K")
R = TypeVar("R")


def grouped(keys: Sequence[K], shard_of: Callable[[K], str]) -> dict[str, list[int]]:
    """The positions of ``keys`` per shard, each list ascending (the caller's order)."""
    out: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        out.setdefault(shard_of(key), []).append(i)
    return out


def in_order(size: int, parts: Iterable[tuple[Sequence[int], Sequence[R]]]) -> list[R]:
    """Per-item answers of each shard (its positions, its answers) back in the caller's
    order; every position must be answered once."""
    out: list[R | None] = [None] * size
    seen = 0
    for positions, answers in parts:
        for i, answer in zip(positions, answers, strict=True):
            out[i] = answer
            seen += 1
    if seen != size:
        raise AssertionError(f"{size - seen} of {size} items have no answer")
    return out  # type: ignore[return-value]  # every slot filled (checked above)


def fire_results(results: Iterable[FireResult]) -> FireResult:
    """One FireResult of several shards' (each over its own partitions)."""
    out = FireResult()
    for r in results:
        out.fired += r.fired
        out.skipped += r.skipped
        out.ready_by_queue.update(r.ready_by_queue)
        out.per_partition.update(r.per_partition)
        out.lateness += r.lateness
        out.traced += r.traced
        out.quarantined += r.quarantined
        out.leased += r.leased
        out.unfinished |= r.unfinished
    return out


#: One READY task at the head of a shard's queue: (priority, run_at, bytes in an answer).
Head = tuple[int, datetime, int]


def claim_shares(
    heads: Mapping[str, Sequence[Head]], want: int, max_bytes: int, *, started: bool = False
) -> dict[str, tuple[int, int]]:
    """How many tasks each shard's claim takes, and their bytes, so that together they are
    the best ``want`` of all heads (priority, then run_at) within ``max_bytes`` (the first
    always, unless the answer has ``started`` with others): the claims lease only what the
    answer keeps. Ties go to the shard listed first."""
    order = {shard: i for i, shard in enumerate(heads)}
    merged = sorted(
        ((-h[0], h[1], order[shard], h[2], shard) for shard, hs in heads.items() for h in hs)
    )
    shares: dict[str, tuple[int, int]] = {}
    used = 0
    for _p, _at, _o, cost, shard in merged[: max(0, want)]:
        if (shares or started) and used + cost > max_bytes:
            break
        n, b = shares.get(shard, (0, 0))
        shares[shard] = (n + 1, b + cost)
        used += cost
    return shares


def summed(counts: Iterable[Mapping[K, int]]) -> dict[K, int]:
    """Counts added key by key."""
    total: Counter[K] = Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def capped_sums(counts: Iterable[Mapping[K, int]], caps: Mapping[K, int]) -> dict[K, int]:
    """Counts added, each no higher than its cap (the ready counts of long polls)."""
    return {k: min(n, caps.get(k, n)) for k, n in summed(counts).items() if n > 0}


def earliest(
    lists: Iterable[Sequence[tuple[str, int, datetime, str, str]]], limit: int
) -> list[tuple[str, int, datetime, str, str]]:
    """The first ``limit`` due-soon entries of several shards, earliest first."""
    merged = [e for entries in lists for e in entries]
    merged.sort(key=lambda e: (e[2], e[0]))
    return merged[:limit]


def page(
    pages: Sequence[Page], page_size: int, max_bytes: int, size_of: Callable[[Task], int]
) -> Page:
    """One keyset page (ordered by id) from each shard's page after the same token.

    Each shard answered its first rows after the token; a shard whose page has more
    (``next_token``: the id it stopped at, its last task's or, for a filtered page that read
    a stretch without a match, past it) may hold ids between that and the others' last ones,
    so the merged page ends at the lowest such token. Within that, the first ``page_size``
    ids that fit ``max_bytes`` (always one). The token is the last id kept, or the bound
    when every task up to it was kept, whatever the map. Ids of one layout sort as the store
    sorts UUIDs (their text is fixed-width hex)."""
    bound = min((p.next_token for p in pages if p.next_token), default=None)
    merged = sorted((t for p in pages for t in p.tasks), key=lambda t: t.id)
    within = [t for t in merged if bound is None or t.id <= bound]
    kept: list[Task] = []
    used = 0
    for t in within[:page_size]:
        cost = size_of(t)
        if kept and used + cost > max_bytes:
            break
        kept.append(t)
        used += cost
    if len(kept) < len(within):
        return Page(kept, kept[-1].id)
    return Page(kept, bound or "")


def queue_counts(answers: Iterable[QueueCounts], max_queues: int) -> QueueCounts:
    """Several shards' queue counts as one: counts added per (queue, state), the oldest
    run_at kept, a state capped if any shard's was, and at most ``max_queues`` queues per
    state in queue order (the others make the state truncated)."""
    n: Counter[tuple[str, TaskState]] = Counter()
    oldest: dict[tuple[str, TaskState], datetime | None] = {}
    capped: set[TaskState] = set()
    truncated: set[TaskState] = set()
    for a in answers:
        capped |= a.capped
        truncated |= a.truncated
        for c in a.counts:
            key = (c.queue, c.state)
            n[key] += c.count
            was = oldest.get(key)
            at = c.oldest_run_at
            oldest[key] = at if was is None else (was if at is None else min(was, at))
    per_state: dict[TaskState, list[str]] = {}
    for queue, state in sorted(n, key=lambda k: (int(k[1]), k[0])):
        per_state.setdefault(state, []).append(queue)
    counts: list[QueueCount] = []
    for state, queues in per_state.items():
        if len(queues) > max_queues:
            truncated.add(state)
        counts += [
            QueueCount(q, state, n[(q, state)], oldest[(q, state)]) for q in queues[:max_queues]
        ]
    return QueueCounts(counts, frozenset(capped), frozenset(truncated))
