"""The owner's next seconds of due tasks, held in memory so each fires at its instant.

A deadline heap with a fixed capacity: the firing tick alone makes a task wait up to a tick,
while an owner that knows what comes due in the next second or two can sleep until the first
instant and fire it then. Instants are integers (the node uses microseconds since the epoch
of its ``Clock``), so "due" is an exact comparison with the same ``now`` that the fire
statement receives: nothing leaves the wheel before its instant, whatever the clock did in
between (a virtual clock jumps both ways).

The wheel is only a shortcut: whatever it refuses (it is full) or loses (ownership moved) is
still in the store and fired by the tick. Entries are keyed by task id, so loading a task
twice holds it once.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass

#: Tasks one wheel holds by default: at 50 bytes of key and ~200 bytes of bookkeeping each,
#: a few tens of megabytes at most, and two seconds of a 10,000 tasks/s owner.
DEFAULT_CAPACITY = 100_000
#: Stale heap records (dropped or re-timed entries) tolerated beyond the live ones before the
#: heap is rebuilt: memory stays within a small multiple of the capacity.
COMPACT_FACTOR = 2


@dataclass(frozen=True, slots=True)
class Due:
    """One task the wheel holds: fire it at ``at`` (the clock's integer instant)."""

    task_id: str
    partition: int
    at: int
    #: (namespace, queue) when known: lets the owner hand the task to a waiting worker.
    key: tuple[str, str] | None = None


class TimingWheel:
    """Due-soon tasks by instant, at most ``capacity`` of them.

    ``pop_due(now)`` yields the entries whose instant is at or before ``now``, earliest first,
    and never one after it; ``drop_partitions`` forgets a partition's entries when its
    ownership moves.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: dict[str, Due] = {}
        # (instant, sequence, task id): the sequence keeps equal instants in arrival order
        # and never compares ids. A record whose entry is gone or re-timed is stale.
        self._heap: list[tuple[int, int, str]] = []
        self._seq = itertools.count()
        self.refused = 0  # adds turned away because the wheel was full

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._entries

    @property
    def free(self) -> int:
        """How many more entries fit."""
        return self.capacity - len(self._entries)

    def add(
        self, task_id: str, partition: int, at: int, key: tuple[str, str] | None = None
    ) -> bool:
        """Hold ``task_id`` until ``at``; False when the wheel is full (the tick fires it).

        Adding a held task again moves it to the new instant (a known key is kept).
        """
        held = self._entries.get(task_id)
        if held is None and len(self._entries) >= self.capacity:
            self.refused += 1
            return False
        if held is not None:
            key = key or held.key
            if held.at == at and held.partition == partition:
                if key != held.key:
                    self._entries[task_id] = Due(task_id, partition, at, key)
                return True
        self._entries[task_id] = Due(task_id, partition, at, key)
        heapq.heappush(self._heap, (at, next(self._seq), task_id))
        self._maybe_compact()
        return True

    def next_at(self) -> int | None:
        """The earliest instant held, or None when empty."""
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: int, limit: int | None = None) -> list[Due]:
        """Remove and return the entries due at ``now`` (instant <= now), earliest first, at
        most ``limit`` of them."""
        out: list[Due] = []
        while self._heap and (limit is None or len(out) < limit):
            at, _seq, task_id = self._heap[0]
            entry = self._entries.get(task_id)
            if entry is None or entry.at != at:
                heapq.heappop(self._heap)
                continue
            if at > now:
                break
            heapq.heappop(self._heap)
            del self._entries[task_id]
            out.append(entry)
        return out

    def discard(self, task_ids: Iterable[str]) -> int:
        """Forget these tasks (fired or cancelled elsewhere); returns how many were held."""
        gone = sum(1 for t in task_ids if self._entries.pop(t, None) is not None)
        self._maybe_compact()
        return gone

    def drop_partitions(self, partitions: Container[int]) -> int:
        """Forget every entry of ``partitions`` (their ownership moved); returns how many."""
        return self._drop(lambda d: d.partition in partitions)

    def keep_partitions(self, partitions: Container[int]) -> int:
        """Forget every entry outside ``partitions``; returns how many."""
        return self._drop(lambda d: d.partition not in partitions)

    def clear(self) -> None:
        self._entries.clear()
        self._heap.clear()

    def partitions(self) -> set[int]:
        """The partitions with entries held."""
        return {d.partition for d in self._entries.values()}

    def _drop(self, doomed: Callable[[Due], bool]) -> int:
        gone = [t for t, d in self._entries.items() if doomed(d)]
        for t in gone:
            del self._entries[t]
        self._maybe_compact()
        return len(gone)

    def _skip_stale(self) -> None:
        while self._heap:
            at, _seq, task_id = self._heap[0]
            entry = self._entries.get(task_id)
            if entry is not None and entry.at == at:
                return
            heapq.heappop(self._heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > COMPACT_FACTOR * max(len(self._entries), self.capacity // 16, 64):
            self._heap = [(d.at, next(self._seq), d.task_id) for d in self._entries.values()]
            heapq.heapify(self._heap)

