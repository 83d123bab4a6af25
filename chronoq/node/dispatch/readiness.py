"""Long-polling claims: who waits for which queue, how many may wait, and what wakes them.

A waiting claim costs nothing while it waits: it sits in the ``ReadyNotifier`` until tasks of
one of its queues become ready (fired, submitted, retried or released on this node; on another
node, told by a PostgreSQL notice through ``ReadyBroadcast``; or found by the node's one shared
``ReadyProbe``, the fallback), and only as many waiters are woken as there are ready tasks.
Per-waiter polling of the store would make a thousand idle long-polls a thousand statements
per poll interval, which starves every other caller of the connection pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence

from chronoq.errors import TooManyLongPolls
from chronoq.node.dispatch.broadcast import NOTICE_BYTES, Broadcast
from chronoq.store.port import Notices

log = logging.getLogger("chronoq.node")

Key = tuple[str, str]  # (namespace, queue)
#: Reads how many tasks are ready per key, counting each key at most up to its cap.
ReadyCounts = Callable[[Sequence[Key], Sequence[int]], Awaitable[Mapping[Key, int]]]

#: Keys asked about per probe statement (a node with more waited queues sends several).
PROBE_CHUNK = 1000


class Watch:
    """One waiter's registration on its keys; a context manager that always unregisters."""

    def __init__(self, notifier: ReadyNotifier, keys: list[Key]) -> None:
        self._notifier = notifier
        self.keys = keys
        # Resolves True when woken, False when a wait timed out: one future and one timer per
        # wait, the least a waiter can cost.
        self._woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.settled = False  # its claim found nothing and it waits

    @property
    def woken(self) -> bool:
        return self._woken.done() and not self._woken.cancelled() and self._woken.result()

    def wake(self) -> None:
        self._resolve(True)
        self.close()

    def _resolve(self, woken: bool) -> None:
        if not self._woken.done():
            self._woken.set_result(woken)

    async def wait(self, timeout: float) -> bool:
        """Wait until woken (True) or ``timeout`` seconds pass (False)."""
        if not self._woken.done() and timeout > 0:
            self._notifier._settle(self)
            timer = asyncio.get_running_loop().call_later(timeout, self._resolve, False)
            try:
                await self._woken
            finally:
                timer.cancel()
        return self.woken

    def close(self) -> None:
        self._notifier._forget(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReadyNotifier:
    """The waiters of each (namespace, queue), oldest first.

    An entry exists only while someone waits on its key: the last waiter to leave removes it,
    so a queue name that nobody waits on any more costs nothing.
    """

    def __init__(self) -> None:
        # A dict as an insertion-ordered set: waiters are woken oldest first.
        self._waiters: dict[Key, dict[Watch, None]] = {}
        self._settled: Counter[Key] = Counter()
        #: Called with the counts of every local notice (the node sends them to the others).
        self.on_notify: Callable[[Mapping[Key, int]], None] | None = None

    def __len__(self) -> int:
        """The number of keys someone waits on."""
        return len(self._waiters)

    def waiting(self) -> dict[Key, int]:
        """How many waiters each waited key has."""
        return {key: len(watches) for key, watches in self._waiters.items()}

    def quiet(self, namespace: str, queues: Iterable[str]) -> bool:
        """Whether each of these queues has a waiter whose claim found nothing and that no
        notice has woken since: a new claim would find nothing either, unless another node
        made tasks ready, which the probe announces as it would to that waiter."""
        return all(self._settled[(namespace, q)] > 0 for q in queues)

    def watch(self, namespace: str, queues: Iterable[str]) -> Watch:
        """Register a waiter on ``queues`` now (before its claim, so no wake-up is missed)."""
        keys = list(dict.fromkeys((namespace, q) for q in queues))
        watch = Watch(self, keys)
        for key in keys:
            self._waiters.setdefault(key, {})[watch] = None
        return watch

    def notify(self, ready: Mapping[Key, int] | Iterable[Key]) -> None:
        """Tasks became ready on this node: wake as many waiters of each key as it has new
        tasks, and tell the other nodes (``on_notify``) of the tasks no local waiter was woken
        for.

        Telling the others of every task would wake a waiter on every node for each one: all
        but one claim would find nothing, and under load those empty claims are what makes
        the others late. A task this node's waiters cannot take wakes one elsewhere at once.
        A mapping gives the count per key; any other iterable counts each occurrence as one.
        """
        counts = ready if isinstance(ready, Mapping) else Counter(ready)
        woken = self.wake(counts)
        if self.on_notify is not None:
            rest = {k: n - woken.get(k, 0) for k, n in counts.items() if n > woken.get(k, 0)}
            if rest:
                self.on_notify(rest)

    def wake(self, counts: Mapping[Key, int]) -> dict[Key, int]:
        """Wake as many waiters of each key as it has ready tasks (told by another node or
        found by the probe: nothing is passed on); returns how many were woken per key."""
        woken: dict[Key, int] = {}
        for key, n in counts.items():
            watches = self._waiters.get(key)
            if not watches or n <= 0:
                continue
            chosen = list(itertools.islice(watches, n))
            for watch in chosen:
                watch.wake()
            woken[key] = len(chosen)
        return woken

    def _settle(self, watch: Watch) -> None:
        if watch.settled or watch not in self._waiters.get(watch.keys[0], ()):
            return
        watch.settled = True
        self._settled.update(watch.keys)

    def _forget(self, watch: Watch) -> None:
        if watch.settled:
            watch.settled = False
            self._settled.subtract(watch.keys)
            for key in watch.keys:
                if self._settled[key] <= 0:
                    del self._settled[key]
        for key in watch.keys:
            watches = self._waiters.get(key)
            if watches is None:
                continue
            watches.pop(watch, None)
            if not watches:
                del self._waiters[key]


class ReadyProbe:
    """The node's one re-check for tasks made ready elsewhere (another node fired them).

    Every ``interval`` (the node runs ``probe`` as a supervised loop) it asks the store, in one
    statement per ``PROBE_CHUNK`` waited keys, how many tasks are ready on each key (counting
    no further than its number of waiters), and wakes that many waiters. It sends nothing
    while nobody waits.
    """

    def __init__(self, notifier: ReadyNotifier, ready_counts: ReadyCounts, interval: float) -> None:
        self._notifier = notifier
        self._ready_counts = ready_counts
        self.interval = interval
        self.probes = 0

    async def probe(self) -> None:
        """One re-check of every waited key (nothing is sent while nobody waits)."""
        waiting = list(self._notifier.waiting().items())
        for start in range(0, len(waiting), PROBE_CHUNK):
            chunk = waiting[start : start + PROBE_CHUNK]
            counts = await self._ready_counts([k for k, _ in chunk], [n for _, n in chunk])
            self.probes += 1
            self._notifier.wake(counts)


class LongPollSlots:
    """How many long-polling claims are open, per namespace and on the node, within caps."""

    def __init__(self, per_namespace: int, per_node: int) -> None:
        self.per_namespace = per_namespace
        self.per_node = per_node
        self._open: Counter[str] = Counter()
        self.total = 0

    def open(self, namespace: str) -> int:
        return self._open[namespace]

    @contextlib.contextmanager
    def hold(self, namespace: str) -> Iterator[None]:
        """Hold one slot for the block; ``TooManyLongPolls`` if a cap is reached."""
        self.take(namespace)
        try:
            yield
        finally:
            self.give(namespace)

    def take(self, namespace: str) -> None:
        """Take one slot (``give`` returns it); ``TooManyLongPolls`` if a cap is reached."""
        if self._open[namespace] >= self.per_namespace:
            raise TooManyLongPolls(namespace, self.per_namespace, "namespace")
        if self.total >= self.per_node:
            raise TooManyLongPolls(namespace, self.per_node, "node")
        self._open[namespace] += 1
        self.total += 1

    def give(self, namespace: str) -> None:
        self.total -= 1
        self._open[namespace] -= 1
        if not self._open[namespace]:
            del self._open[namespace]


# ---------------------------------------------------------------- across nodes

#: The PostgreSQL channel on which nodes tell each other which queues have new ready tasks.
READY_CHANNEL = "chronoq_ready"
#: Local notices go out at once; those made while one is in flight are gathered and sent
#: as the next NOTIFY, so a busy node sends about one per round trip to the store however
#: many tasks become ready, and a quiet one adds no delay. Waiting to gather (10 ms here
#: before) made every wake-up on another node that much later.
#: While notices are heard, the store re-check is only a fallback, this much slower.
PROBE_SLOWDOWN = 10
PROBE_FALLBACK_MAX = 5.0


def encode_notices(node_id: str, ready: Mapping[Key, int]) -> list[str]:
    """``ready`` as NOTIFY payloads of at most ``NOTICE_BYTES`` each (JSON)."""
    payloads: list[str] = []
    entries: list[list[object]] = []
    size = 0
    for (namespace, queue), n in ready.items():
        entry: list[object] = [namespace, queue, n]
        cost = len(json.dumps(entry).encode()) + 1
        if entries and size + cost > NOTICE_BYTES:
            payloads.append(json.dumps({"node": node_id, "ready": entries}))
            entries, size = [], 0
        entries.append(entry)
        size += cost
    if entries:
        payloads.append(json.dumps({"node": node_id, "ready": entries}))
    return payloads


def decode_notice(payload: str) -> tuple[str, dict[Key, int]]:
    """(sending node, ready counts) of a payload; ValueError if it is not one of ours."""
    doc = json.loads(payload)
    if not isinstance(doc, dict) or not isinstance(doc.get("ready"), list):
        raise ValueError("not a readiness notice")
    ready: dict[Key, int] = {}
    for entry in doc["ready"]:
        namespace, queue, n = entry
        if not (isinstance(namespace, str) and isinstance(queue, str) and isinstance(n, int)):
            raise ValueError("not a readiness notice")
        ready[(namespace, queue)] = ready.get((namespace, queue), 0) + n
    return str(doc.get("node", "")), ready


class ReadyBroadcast(Broadcast[dict[Key, int]]):
    """Tasks made ready on one node wake the long-polls of every node at once.

    Local notices (fired, submitted due, retried, released, requeued) are sent at once as
    one NOTIFY on ``READY_CHANNEL`` (those made meanwhile gather into the next one); every
    node's listener wakes its own waiters. Delivery is best effort: a lost notice costs the
    probe's fallback interval, never a task.
    """

    channel = READY_CHANNEL

    def __init__(self, notifier: ReadyNotifier, notices: Notices, node_id: str) -> None:
        super().__init__(notices, node_id)
        self._notifier = notifier
        self._pending: Counter[Key] = Counter()

    def publish(self, ready: Mapping[Key, int]) -> None:
        """Queue local notices for the other nodes (called by ``ReadyNotifier.notify``)."""
        self._pending.update(ready)
        self._send_soon()

    def _has_pending(self) -> bool:
        return bool(self._pending)

    def _take_payloads(self) -> list[str]:
        ready, self._pending = self._pending, Counter()
        return encode_notices(self.node_id, ready)

    def _decode(self, payload: str) -> tuple[str, dict[Key, int]]:
        return decode_notice(payload)

    def _deliver(self, body: dict[Key, int]) -> None:
        self._notifier.wake(body)

    def probe_interval(self, every: float) -> float:
        """The store re-check's interval: ``every`` while no notice can be heard, a slow
        fallback while they can."""
        if not self.listening:
            return every
        return max(every, min(every * PROBE_SLOWDOWN, PROBE_FALLBACK_MAX))

