"""The console's side of the cluster: gRPC clients with the operator's token, and polling.

Every call goes through the client SDK. One client per namespace the pages ask about (a
client is bound to one namespace; a token for one namespace is refused the others by the
node, and the page shows that refusal), each over every configured address, so calls fail
over when a node goes away. Besides, one single-address client per configured address polls
``Status`` to show which nodes answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chronoq import errors
from chronoq.client import Client, ClusterStatus
from chronoq.console.samples import NodeSample, Sample, SampleRing
from chronoq.console.views import (
    QueueTally,
    in_window,
    iso,
    queue_settings_row,
    schedule_row,
    shard_map_view,
    task_detail,
    task_summary,
)
from chronoq.limits import MAX_REQUEUE_IDS, check_name
from chronoq.models import TaskState
from chronoq.targets import node_targets

log = logging.getLogger("chronoq.console")

#: Deadline of a console call: a page waits no longer for an answer.
CALL_TIMEOUT = 5.0
#: Deadline of one node's Status poll: a node slower than this is shown as not answering.
PROBE_TIMEOUT = 2.0
#: Upcoming buckets whose pending tasks the overview charts.
BUCKET_HORIZON = 30
#: Namespaces with an open client at most (the least recently used one is closed).
MAX_NAMESPACE_CLIENTS = 16
#: How long the queues page's counts are reused.
QUEUE_TALLY_SECONDS = 3.0
#: Pages of the API a filtered task list reads at most to fill one page of its own.
TASK_SCAN_PAGES = 10
DEFAULT_LIST_SIZE = 50
MAX_LIST_SIZE = 500
#: Ids in one bulk action at most, and cancels sent at once.
MAX_BULK_IDS = min(500, MAX_REQUEUE_IDS)
CANCEL_CONCURRENCY = 16
#: Node ids that left the membership are shown this long.
GONE_SECONDS = 600.0
MAX_GONE = 32


@dataclass
class NodeReach:
    """What the console knows of one configured address."""

    address: str
    reachable: bool = False
    node_id: str = ""
    error: str = "not polled yet"
    last_seen: float | None = None  # Unix time of the last answer

    def as_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "reachable": self.reachable,
            "node_id": self.node_id,
            "error": self.error,
            "last_seen": self.last_seen,
        }


@dataclass(frozen=True)
class TaskFilter:
    namespace: str
    queue: str | None = None
    state: TaskState | None = None
    start: datetime | None = None  # run_at window [start, end)
    end: datetime | None = None
    page_token: str = ""
    page_size: int = DEFAULT_LIST_SIZE
    dead: bool = False


@dataclass
class _Tally:
    at: float
    result: dict[str, Any]


@dataclass
class ClusterLink:
    """Clients of the cluster for the console, and the ring of Status samples."""

    address: str
    client_options: Mapping[str, Any] = field(default_factory=dict)
    history: int = 300

    def __post_init__(self) -> None:
        self.addresses = node_targets(self.address)
        self.ring = SampleRing(self.history)
        self.reach = {a: NodeReach(a) for a in self.addresses}
        self.status: ClusterStatus | None = None
        self.status_at: float | None = None
        self._probes = {
            a: Client(a, timeout=PROBE_TIMEOUT, **self.client_options) for a in self.addresses
        }
        self._clients: OrderedDict[str, Client] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._gone: dict[str, float] = {}  # node id -> when it left the membership
        self._seen: set[str] = set()
        self._tallies: dict[str, _Tally] = {}

    async def close(self) -> None:
        for client in [*self._probes.values(), *self._clients.values()]:
            await client.close()
        await asyncio.gather(*self._closing, return_exceptions=True)

    def client(self, namespace: str) -> Client:
        """The client of ``namespace`` (validated), opened on first use."""
        namespace = check_name("namespace", namespace)
        client = self._clients.get(namespace)
        if client is not None:
            self._clients.move_to_end(namespace)
            return client
        if len(self._clients) >= MAX_NAMESPACE_CLIENTS:
            _, oldest = self._clients.popitem(last=False)
            closing = asyncio.create_task(oldest.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        client = Client(
            self.address, namespace=namespace, timeout=CALL_TIMEOUT, **self.client_options
        )
        self._clients[namespace] = client
        return client

    # ------------------------------------------------------------------ overview

    async def poll(self) -> None:
        """Ask every configured address for Status; keep the freshest answer as the view."""
        answers = await asyncio.gather(*(self._probe(a) for a in self.addresses))
        now = time.time()
        fresh = [s for s in answers if s is not None]
        if not fresh:
            return
        status = fresh[0]
        self.status, self.status_at = status, now
        self.ring.add(
            Sample(
                at=now,
                pending=sum(b.pending for b in status.buckets),
                nodes=tuple(
                    NodeSample(m.node_id, m.fired_total, m.lateness_p50_ms, m.lateness_p99_ms)
                    for m in status.members
                ),
            )
        )
        members = {m.node_id for m in status.members}
        for node_id in members:
            self._gone.pop(node_id, None)
        for node_id in self._seen - members:
            self._gone.setdefault(node_id, now)
        self._seen = members | set(self._gone)
        for node_id, since in list(self._gone.items()):
            if now - since > GONE_SECONDS or len(self._gone) > MAX_GONE:
                del self._gone[node_id]

    async def _probe(self, address: str) -> ClusterStatus | None:
        reach = self.reach[address]
        try:
            status = await asyncio.wait_for(
                self._probes[address].status(BUCKET_HORIZON), PROBE_TIMEOUT + 0.5
            )
        except errors.ChronoqError as exc:
            reach.reachable, reach.error = False, exc.message
            return None
        except TimeoutError:
            reach.reachable, reach.error = False, f"no answer within {PROBE_TIMEOUT:g} s"
            return None
        reach.reachable, reach.error = True, ""
        reach.node_id, reach.last_seen = status.node_id, time.time()
        return status

    def overview(self) -> dict[str, Any]:
        """Everything the overview page shows, from the last poll."""
        status = self.status
        rates = self.ring.node_rates()
        series = self.ring.series()
        base: dict[str, Any] = {
            "addresses": [r.as_json() for r in self.reach.values()],
            "gone": sorted(self._gone),
            "series": {
                "at": series.at,
                "fired_per_s": series.fired_per_s,
                "lateness_p50_ms": series.lateness_p50_ms,
                "lateness_p99_ms": series.lateness_p99_ms,
                "pending": series.pending,
            },
            "status_at": self.status_at,
        }
        if status is None:
            return {**base, "ok": False, "error": "no node has answered yet"}
        return {
            **base,
            "ok": any(r.reachable for r in self.reach.values()),
            "cluster": status.cluster,
            "answered_by": status.node_id,
            "now": iso(status.now),
            "partitions": status.partitions,
            "bucket_seconds": status.bucket_seconds,
            "members": [
                {
                    "node_id": m.node_id,
                    "address": m.address,
                    "owned_partitions": m.owned_partitions,
                    "lateness_p50_ms": m.lateness_p50_ms,
                    "lateness_p99_ms": m.lateness_p99_ms,
                    "fired_total": m.fired_total,
                    "fired_per_s": rates.get(m.node_id),
                }
                for m in sorted(status.members, key=lambda m: m.node_id)
            ],
            "ownership": [
                {
                    "partition": o.partition,
                    "owner": o.owner,
                    "fencing_token": o.fencing_token,
                    "watermark_bucket": o.watermark_bucket,
                }
                for o in sorted(status.ownership, key=lambda o: o.partition)
            ],
            "buckets": [
                {"bucket": b.bucket, "starts_at": iso(b.starts_at), "pending": b.pending}
                for b in status.buckets
            ],
        }

    def shards(self) -> dict[str, Any]:
        """The shards page, from the last poll's Status (the map, health, sizes, moves)."""
        status = self.status
        base = {"status_at": self.status_at}
        if status is None:
            return {**base, "ok": False, "error": "no node has answered yet"}
        return {**base, **shard_map_view(status.shard_map, status.node_id)}

    # ------------------------------------------------------------------ queues

    async def queues(self, namespace: str) -> dict[str, Any]:
        """Per-queue counts of the non-final states, the ready age and the dispatch limits."""
        client = self.client(namespace)
        cached = self._tallies.get(namespace)
        if cached is not None and time.monotonic() - cached.at < QUEUE_TALLY_SECONDS:
            return cached.result
        tally = QueueTally()
        limits, counts = await asyncio.gather(client.queue_limits(), client.queue_counts())
        tally.take(counts)
        result = {"namespace": client.namespace, **tally.as_json(limits, counts.now)}
        if len(self._tallies) >= MAX_NAMESPACE_CLIENTS:
            self._tallies.clear()
        self._tallies[namespace] = _Tally(time.monotonic(), result)
        return result

    async def set_limit(self, namespace: str, queue: str, rate: float, burst: float) -> None:
        await self.client(namespace).set_queue_limit(queue, rate, burst)
        self._tallies.pop(namespace, None)

    async def queue_settings(self, namespace: str) -> dict[str, Any]:
        """The namespace's queues with settings: paused (since when), per-key limits."""
        client = self.client(namespace)
        found = await client.list_queue_settings()
        return {"namespace": client.namespace, "queues": [queue_settings_row(s) for s in found]}

    async def queue_action(self, namespace: str, queue: str, action: str) -> dict[str, Any]:
        """Pause or resume a queue (the console's session is the caller's token)."""
        client = self.client(namespace)
        queue = check_name("queue", queue)
        if action == "pause":
            return queue_settings_row(await client.pause_queue(queue))
        resumed = await client.resume_queue(queue)
        return {**queue_settings_row(resumed.settings), "skipped": resumed.skipped}

    # ------------------------------------------------------------------ tasks

    async def tasks(self, f: TaskFilter) -> dict[str, Any]:
        """One page of matching tasks. The API filters by queue and state; the run_at window is
        applied here, reading up to ``TASK_SCAN_PAGES`` API pages to fill the page."""
        client = self.client(f.namespace)
        size = max(1, min(f.page_size, MAX_LIST_SIZE))
        found: list[dict[str, Any]] = []
        token, scanned = f.page_token, 0
        windowed = f.start is not None or f.end is not None
        for _ in range(TASK_SCAN_PAGES if windowed else 1):
            page = await client.list(
                queue=f.queue, state=f.state, page_size=size, page_token=token, dead=f.dead
            )
            scanned += len(page.tasks)
            found += [task_summary(t) for t in page.tasks if in_window(t, f.start, f.end)]
            token = page.next_token
            if not token or len(found) >= size:
                break
        return {"tasks": found, "next_page_token": token, "scanned": scanned}

    async def task(self, namespace: str, task_id: str) -> tuple[dict[str, Any], bytes]:
        task = await self.client(namespace).get(task_id)
        return task_detail(task), task.payload

    async def cancel(self, namespace: str, ids: list[str]) -> list[dict[str, Any]]:
        """Cancel each task; one result per id (a task that cannot be cancelled says why)."""
        client = self.client(namespace)
        gate = asyncio.Semaphore(CANCEL_CONCURRENCY)

        async def one(task_id: str) -> dict[str, Any]:
            async with gate:
                try:
                    task = await client.cancel(task_id)
                except errors.ChronoqError as exc:
                    return {"id": task_id, "ok": False, "error": exc.message}
                return {"id": task_id, "ok": True, "state": task.state.name.lower()}

        return list(await asyncio.gather(*(one(i) for i in ids)))

    async def requeue(self, namespace: str, ids: list[str]) -> list[dict[str, Any]]:
        """Requeue the dead tasks among ``ids``; one result per id."""
        done = {t.id: t for t in await self.client(namespace).requeue(ids)}
        return [
            {"id": i, "ok": True, "state": done[i].state.name.lower()}
            if i in done
            else {"id": i, "ok": False, "error": "not dead (or no such task): not requeued"}
            for i in ids
        ]

    # ------------------------------------------------------------------ schedules

    async def schedules(self, namespace: str) -> dict[str, Any]:
        client = self.client(namespace)
        rows = [schedule_row(s) for s in await client.list_schedules()]
        return {"namespace": client.namespace, "schedules": rows}

    async def schedule_action(self, namespace: str, name: str, action: str) -> dict[str, Any]:
        client = self.client(namespace)
        name = check_name("name", name)
        if action == "pause":
            return schedule_row(await client.pause_schedule(name))
        if action == "resume":
            return schedule_row(await client.resume_schedule(name))
        await client.delete_schedule(name)
        return {"name": name, "deleted": True}
