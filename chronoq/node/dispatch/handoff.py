"""The hand-off: an owner fires a task straight to a worker stream waiting on this node.

Without it a task due now takes two writes and a wake-up before a handler starts: the fire
(SCHEDULED → READY), a notice that wakes a waiting claim, and the claim (READY → RUNNING).
When the timing wheel fires tasks of a queue on which a worker stream of this node has free
credits, the fire statement leases them to that stream's worker in the same write
(``fire_ids_leasing``), and the node pushes them on the stream at once: one statement and one
message from the instant to the handler.

A plan reserves the credits it offers before the statement and gives back what the statement
did not use (a task skipped by its misfire policy, fired elsewhere, or a fence lost), so a
stream never gets more tasks than it has credits for. It reserves bytes the same way: the
statement leases a stream's tasks only while they fit in the stream's room (its byte budget
less what it holds unwritten, always one task), the rest fire READY, so a stream whose worker
does not read takes no more hand-offs than its budget. Gated queues (a dispatch limit, a
pause, a limit per concurrency key: ``chronoq.node.dispatch.gate``) are never handed off:
their claims take tokens from the limit, or the claim statement decides whether they may run
(and the fire statement refuses a queue its settings gate, whatever this node's gate said).

A submit of a task due at once is handed off the same way (``take``, through
``chronoq.node.dispatch.submit_handoff``): its insert leases the task to a waiting stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

from chronoq.models import Task
from chronoq.wheel import Due

Key = tuple[str, str]  # (namespace, queue)


class Taker(Protocol):
    """What the hand-off needs of a worker stream (``WorkSession``)."""

    worker_id: str

    def available(self) -> int: ...

    def room(self) -> int:
        """Bytes a claim or hand-off may still fill."""
        ...

    def reserve(self, n: int, most: int | None = None) -> int:
        """Hold ``n`` credits and the stream's free bytes (at most ``most``); returns the
        bytes held."""
        ...

    def deliver(self, tasks: list[Task], reserved: int, reserved_bytes: int) -> None: ...

    def offered(self) -> None:
        """The wheel fired tasks this stream could take (whether it had credits or not)."""
        ...


@dataclass
class Plan:
    """What one fire statement hands off: ``leases`` (task id → worker id) and ``budgets``
    (task id → (its stream's number in the plan, the stream's byte budget)) for the store,
    and the reservations to settle with what it returns."""

    leases: dict[str, str] = field(default_factory=dict)
    budgets: dict[str, tuple[int, int]] = field(default_factory=dict)
    _takers: dict[str, Taker] = field(default_factory=dict)  # task id → its stream
    _reserved: dict[Taker, tuple[int, int]] = field(default_factory=dict)  # credits, bytes
    _settled: bool = False

    def settle(self, leased: Iterable[Task]) -> int:
        """Push each leased task to its stream; give back the credits not used. Returns the
        number of tasks handed off."""
        if self._settled:
            return 0
        self._settled = True
        mine: dict[Taker, list[Task]] = {taker: [] for taker in self._reserved}
        for task in leased:
            taker = self._takers.get(task.id)
            if taker is not None:
                mine[taker].append(task)
        for taker, tasks in mine.items():
            taker.deliver(tasks, *self._reserved[taker])
        return sum(len(t) for t in mine.values())

    def budgeted(self) -> Plan:
        """Fill ``budgets``: one byte budget per stream, however many of its keys it serves."""
        group = {taker: i for i, taker in enumerate(self._reserved)}
        self.budgets = {
            task_id: (group[taker], self._reserved[taker][1])
            for task_id, taker in self._takers.items()
        }
        return self

    def cancel(self) -> None:
        """The statement failed: nothing was leased, every reservation goes back."""
        self.settle(())


@dataclass
class Single:
    """One submit's hand-off: the stream (``worker_id``) its insert leases the task to, with
    one credit and the task's bytes held on that stream until ``settle``."""

    worker_id: str
    _taker: Taker
    _bytes: int
    _settled: bool = False

    def settle(self, leased: Task | None) -> bool:
        """Push ``leased`` (the task the insert leased, None: it leased nothing) and free
        what it did not use; whether a task was handed off. Once only."""
        if self._settled:
            return False
        self._settled = True
        tasks = [] if leased is None else [leased]
        self._taker.deliver(tasks, 1, self._bytes)
        return bool(tasks)


class HandOff:
    """The worker streams of this node, by the keys they work on."""

    def __init__(self, gated: Callable[[], AbstractSet[Key] | None]) -> None:
        """``gated``: the keys never handed off (``Gate.known``), or None while not known
        yet (then nothing is handed off)."""
        self._gated = gated
        self._takers: dict[Key, dict[Taker, None]] = {}

    def join(self, taker: Taker, keys: Iterable[Key]) -> None:
        for key in keys:
            self._takers.setdefault(key, {})[taker] = None

    def leave(self, taker: Taker, keys: Iterable[Key]) -> None:
        for key in keys:
            takers = self._takers.get(key)
            if takers is None:
                continue
            takers.pop(taker, None)
            if not takers:
                del self._takers[key]

    def plan(self, due: Sequence[Due]) -> Plan | None:
        """Assign due tasks of known keys to streams with free credits, oldest stream of a
        key first (each key's streams take turns across plans); None when none can take."""
        if not self._takers:
            return None
        gated = self._gated()
        if gated is None:
            return None
        by_key: dict[Key, list[str]] = {}
        for d in due:
            if d.key is not None and d.key in self._takers and d.key not in gated:
                by_key.setdefault(d.key, []).append(d.task_id)
        if not by_key:
            return None
        plan = Plan()
        for key, ids in by_key.items():
            takers = self._takers[key]
            served: list[Taker] = []
            for taker in list(takers):
                if not ids:
                    break
                taker.offered()
                n = min(taker.available(), len(ids))
                if n <= 0:
                    continue
                room = taker.reserve(n)
                credits, held = plan._reserved.get(taker, (0, 0))
                plan._reserved[taker] = (credits + n, held + room)
                for task_id in ids[:n]:
                    plan.leases[task_id] = taker.worker_id
                    plan._takers[task_id] = taker
                del ids[:n]
                served.append(taker)
            for taker in served:  # to the back of the key's turn
                takers.pop(taker, None)
                takers[taker] = None
        return plan.budgeted() if plan.leases else None

    def serves(self, key: Key) -> bool:
        """Whether a stream of this node works on ``key``."""
        return key in self._takers

    def take(self, key: Key, size: int) -> Single | None:
        """A stream of ``key`` for one task of ``size`` bytes (its worker id not counted),
        which a submit's insert leases to it: the oldest with a free credit and room for the
        task (the streams of a key take turns); None when none can take it, while the gate
        is not known, or when ``key`` is gated (claims only)."""
        takers = self._takers.get(key)
        if not takers:
            return None
        gated = self._gated()
        if gated is None or key in gated:
            return None
        for taker in takers:
            taker.offered()
            need = size + len(taker.worker_id.encode())
            if taker.available() > 0 and need <= taker.room():
                taker.reserve(1, need)
                takers.pop(taker)
                takers[taker] = None  # to the back of the key's turn
                return Single(taker.worker_id, taker, need)
        return None
