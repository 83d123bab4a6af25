"""The async Python client of a chronoq node. Protobuf stays inside; models come out."""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import grpc

from chronoq import errors, tracing
from chronoq.api import convert
from chronoq.api.v1 import tasks_pb2, worker_pb2
from chronoq.client.bulk import BulkCalls
from chronoq.client.cluster import ClusterCalls
from chronoq.client.columns import columnar
from chronoq.client.counts import QueueCountCalls
from chronoq.client.pool import NodePool, NodeStubs, open_channel
from chronoq.client.queues import QueueSettingCalls
from chronoq.client.remote import translate
from chronoq.client.schedule_calls import ScheduleCalls
from chronoq.client.stream import OnTasks, WorkStream
from chronoq.client.values import (
    NewTask,
    Submitted,
    new_keys,
)
from chronoq.limits import MAX_ANSWER_BYTES, full_answer_bytes
from chronoq.models import (
    DEFAULT_NAMESPACE,
    AckOutcome,
    HeartbeatOutcome,
    Lease,
    Page,
    QueueCounts,
    Task,
    TaskState,
)
from chronoq.targets import node_targets
from chronoq.tls import channel_credentials

log = logging.getLogger("chronoq.client")

#: Deadline of an ack, heartbeat, failure report or release: one indexed statement; a node
#: that takes longer is in trouble, and the call is better retried on another node.
ACK_TIMEOUT = 2.5
#: A claim's deadline is its long-poll ``wait`` plus this, for the claim statement and the
#: round trip. Keepalive finds a frozen node sooner; this bounds a node that answers pings
#: but not calls, and leaves a loaded node time (a claim answered too late is lost work).
CLAIM_MARGIN = 3.0
#: Codes after which a call that is safe to repeat goes to another node: the node did not
#: answer (dead, frozen, cut off, shutting down) or could not reach its store.
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
#: A node whose store is failing over answers UNAVAILABLE with this in the details (the
#: store's ``connection.UNKNOWN_OUTCOME``): the call may or may not have taken effect, and
#: every node shares the store, so a call that is safe to repeat is repeated, with backoff,
#: for this many seconds: a Patroni failover after a lost member takes about its 20 s TTL.
STORE_OUTAGE_MARK = "outcome unknown"
STORE_RETRY_S = 45.0
STORE_RETRY_PAUSE_S = (0.1, 1.0)  # first pause, and the cap of the doubling

#: A submit of more tasks than this goes in requests of this many, each its own transaction,
#: and at most ``SUBMIT_IN_FLIGHT`` of them on the wire at once: one a stage, so the client
#: encodes a part while the node checks the next and the store inserts the one before (one
#: client, 20,000 tasks on 2 shared cores: 17,000/s with two in flight, 22,000/s with three,
#: no more with four).
SUBMIT_PART = 1000
SUBMIT_IN_FLIGHT = 3
#: What a node older than the columnar form of ``SubmitBatch`` answers it (it sees no
#: tasks, so it inserted nothing): the client sends whole specs from then on.
OLD_NODE_REFUSAL = "tasks: must hold at least one task"

T = TypeVar("T")
K = TypeVar("K")
R = TypeVar("R")
#: A spec's framing inside a batch request at most (its field tag and length).
SPEC_FRAMING_BYTES = 6
Method = Callable[[NodeStubs], Any]


class Client(QueueCountCalls, BulkCalls, QueueSettingCalls, ClusterCalls, ScheduleCalls):
    """Talks to a chronoq node, or to several (any node of a cluster serves every call).

    Use ``async with Client("127.0.0.1:7070") as client: await client.submit("emails", delay=...)``.
    """

    def __init__(
        self,
        target: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        timeout: float = 30.0,
        channel: grpc.aio.Channel | None = None,
        token: str | None = None,
        tls: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        """``target``: a node's ``host:port``, or several comma-separated. With several, the
        client keeps a connection to each and follows its health: calls go round robin over
        the nodes that answer SERVING, a node that stops answering keepalive pings (dead,
        frozen, cut off) or says NOT_SERVING gets no new calls until it recovers, and a call
        that is safe to repeat (submits, reads, heartbeats, acks and failure reports) is
        retried on another node when its node fails it. A gRPC target (``dns:///name:7070``)
        is used as is.

        ``timeout``: the deadline of calls without one of their own (acks and heartbeats have
        ``ACK_TIMEOUT``, claims their wait plus ``CLAIM_MARGIN``).

        ``token``: bearer token for nodes with ``auth_tokens``. TLS when ``tls`` or any
        ``tls_*`` is given: ``tls_ca`` is the CA to trust (None: the system's roots),
        ``tls_cert``/``tls_key`` a client certificate for nodes that require mutual TLS; each
        node's certificate must name the host of its address."""
        self.target = target
        self.namespace = namespace
        self.timeout = timeout
        self.failovers = 0  # calls retried on another node
        self._columnar = True  # bulk submits in the columnar form, until a node refuses it
        self._metadata = bearer_metadata(token)
        if channel is not None:
            self._pool = NodePool([(target, channel)])
            return
        secure = tls or tls_ca or tls_cert or tls_key
        credentials = channel_credentials(tls_ca, tls_cert, tls_key) if secure else None
        self._pool = NodePool(
            [(address, open_channel(address, credentials)) for address in node_targets(target)]
        )

    @property
    def addresses(self) -> builtins.list[str]:
        """The nodes this client talks to."""
        return [n.address for n in self._pool.nodes]

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until a node's channel connects (a node is up)."""
        try:
            await asyncio.wait_for(self._pool.wait_ready(), timeout)
        except TimeoutError:
            raise errors.Unavailable(
                f"no chronoq node answered at {self.target} within {timeout} s"
            ) from None

    async def _call(
        self, method: Method, request: Any, *, timeout: float | None = None, retry: bool = False
    ) -> Any:
        """One call on the picked node; when ``retry`` (the call is safe to repeat) a node
        that fails it with a code of ``FAILOVER_CODES`` hands it to the next node, once per
        node at most."""
        tried: builtins.list[int] = []
        started = asyncio.get_running_loop().time()
        pause = STORE_RETRY_PAUSE_S[0]
        while True:
            index = self._pool.pick(tried)
            tried.append(index)
            try:
                reply = await method(self._pool.nodes[index])(
                    request, timeout=timeout or self.timeout, metadata=self._metadata
                )
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code not in FAILOVER_CODES:
                    raise translate(exc) from exc
                outage = code is grpc.StatusCode.UNAVAILABLE and STORE_OUTAGE_MARK in (
                    exc.details() or ""
                )
                if not outage:
                    self._pool.failed(index)  # the node answered: only its store is away
                if retry and outage and len(tried) >= len(self._pool):
                    if asyncio.get_running_loop().time() - started < STORE_RETRY_S:
                        log.debug("store unavailable, retrying in %.1f s", pause)
                        await asyncio.sleep(pause)
                        pause = min(2 * pause, STORE_RETRY_PAUSE_S[1])
                        tried.clear()
                        continue
                if not retry or len(tried) >= len(self._pool):
                    raise translate(exc) from exc
                self.failovers += 1
                log.debug(
                    "%s from %s, retrying on another node",
                    code.name,
                    self._pool.nodes[index].address,
                )
                continue
            self._pool.answered(index)
            return reply

    @property
    def ack_timeout(self) -> float:
        """The deadline of acks and heartbeats: the client's timeout, at most ``ACK_TIMEOUT``."""
        return min(self.timeout, ACK_TIMEOUT)

    def _keyed(self, tasks: Sequence[NewTask]) -> list[tuple[tasks_pb2.TaskSpec, bool]]:
        """The tasks as wire specs. A submit may be retried (on another node, or after a
        store failover left its outcome unknown): each task without an idempotency key gets
        one, so the retry cannot create a second task. True: the key is ours (whatever the
        node answers, the task was created by this call), unless the task has a unique or a
        debounce key: the answer may then be another caller's task, and the node's word
        stands. The keys are time-ordered, like task ids, so a batch's entries in the key index
        land side by side."""
        keys = iter(new_keys(sum(1 for t in tasks if not t.idempotency_key)))
        return [
            (t.to_pb(self.namespace), False)
            if t.idempotency_key
            else _ours(t.to_pb(self.namespace, idempotency_key=next(keys)))
            for t in tasks
        ]

    # ------------------------------------------------------------------ tasks

    @tracing.client_span
    async def submit(self, queue: str, **fields: Any) -> Submitted:
        """Submit one task; see ``NewTask`` for the fields (run_at or delay, payload, ...)."""
        ((spec, ours),) = self._keyed([NewTask(queue=queue, **fields)])
        resp = await self._call(
            lambda n: n.tasks.Submit, tasks_pb2.SubmitRequest(task=spec), retry=True
        )
        return Submitted(convert.task_from_pb(resp.task), resp.created or ours)

    @tracing.client_span
    async def submit_many(self, tasks: Sequence[NewTask]) -> builtins.list[Submitted]:
        """Submit a batch; results in request order. Up to ``SUBMIT_PART`` tasks: one request
        and one transaction while the answer (every task echoed) fits in a node's answer
        budget. A larger batch goes in consecutive requests of at most ``SUBMIT_PART`` tasks
        that each fit, each its own transaction, three on the wire at once (every task has an
        idempotency key, so a retry after a failure creates nothing twice)."""
        return await self._in_parts(tasks, self._submit_many_part)

    async def _submit_many_part(self, tasks: Sequence[NewTask]) -> builtins.list[Submitted]:
        out: builtins.list[Submitted] = []
        for part in answer_sized(self._keyed(tasks)):
            req = tasks_pb2.SubmitBatchRequest(tasks=[spec for spec, _ in part])
            resp = await self._call(lambda n: n.tasks.SubmitBatch, req, retry=True)
            out += [
                Submitted(convert.task_from_pb(t), c or ours)
                for t, c, (_, ours) in zip(resp.tasks, resp.created, part, strict=True)
            ]
        return out

    @tracing.client_span
    async def submit_ids(self, tasks: Sequence[NewTask]) -> builtins.list[tuple[str, bool]]:
        """Like ``submit_many`` but answered with (task id, created) pairs only: for bulk loads,
        where echoing every task back would cost more than inserting it. Up to
        ``SUBMIT_PART`` tasks go in one request and one transaction."""
        return await self._in_parts(tasks, self._submit_ids_part)

    async def _submit_ids_part(self, tasks: Sequence[NewTask]) -> builtins.list[tuple[str, bool]]:
        columns = columnar(tasks, self.namespace) if self._columnar else None
        if columns is not None:
            req, ours = columns
            try:
                resp = await self._call(lambda n: n.tasks.SubmitBatch, req, retry=True)
            except errors.RemoteError as exc:
                if OLD_NODE_REFUSAL not in str(exc):
                    raise
                self._columnar = False  # a node older than the columnar form: whole specs
            else:
                return [
                    (i, c or mine) for i, c, mine in zip(resp.ids, resp.created, ours, strict=True)
                ]
        keyed = self._keyed(tasks)
        req = tasks_pb2.SubmitBatchRequest(tasks=[spec for spec, _ in keyed], ids_only=True)
        resp = await self._call(lambda n: n.tasks.SubmitBatch, req, retry=True)
        return [
            (i, c or ours) for i, c, (_, ours) in zip(resp.ids, resp.created, keyed, strict=True)
        ]

    async def _in_parts(
        self,
        tasks: Sequence[NewTask],
        send: Callable[[Sequence[NewTask]], Awaitable[builtins.list[R]]],
    ) -> builtins.list[R]:
        """``send`` of ``tasks`` in consecutive parts of ``SUBMIT_PART``, at most
        ``SUBMIT_IN_FLIGHT`` at once, the answers in order. A part that fails starts no other:
        the ones in flight end first, then its error is raised, saying which tasks it held
        and that those before it were accepted (the parts in flight beside it may have been)."""
        if len(tasks) <= SUBMIT_PART:
            return await send(tasks)
        out: builtins.list[R] = []
        flying: deque[tuple[int, asyncio.Future[builtins.list[R]]]] = deque()
        try:
            for start in range(0, len(tasks), SUBMIT_PART):
                if len(flying) >= SUBMIT_IN_FLIGHT:
                    out += await _landed(*flying.popleft(), len(tasks))
                part = tasks[start : start + SUBMIT_PART]
                flying.append((start, asyncio.ensure_future(send(part))))
            while flying:
                out += await _landed(*flying.popleft(), len(tasks))
        except asyncio.CancelledError:
            for _start, call in flying:
                call.cancel()
            raise
        finally:
            if flying:  # a part failed or we were cancelled: none is left running unawaited
                await asyncio.gather(*(call for _start, call in flying), return_exceptions=True)
        return out

    async def get(self, task_id: str) -> Task:
        req = tasks_pb2.GetTaskRequest(namespace=self.namespace, id=task_id)
        return convert.task_from_pb(await self._call(lambda n: n.tasks.GetTask, req, retry=True))

    async def cancel(self, task_id: str) -> Task:
        req = tasks_pb2.CancelTaskRequest(namespace=self.namespace, id=task_id)
        return convert.task_from_pb(await self._call(lambda n: n.tasks.CancelTask, req))

    async def list(
        self,
        *,
        queue: str | None = None,
        state: TaskState | None = None,
        page_size: int = 100,
        page_token: str = "",
        dead: bool = False,
        labels: Mapping[str, str] | None = None,
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
    ) -> Page:
        """A page of tasks ordered by id: of ``queue``, in ``state``, carrying every one of
        ``labels``, with run_at in ``[run_at_from, run_at_to)``. Filtered by labels or run_at,
        a page may hold fewer tasks than ``page_size`` (even none) before its next token."""
        req = tasks_pb2.ListTasksRequest(
            namespace=self.namespace,
            queue=queue or "",
            page_size=page_size,
            page_token=page_token,
            state=convert.state_to_pb(state)
            if state is not None
            else tasks_pb2.TASK_STATE_UNSPECIFIED,
            labels=dict(labels or {}),
            run_at_from=convert.to_timestamp(run_at_from),
            run_at_to=convert.to_timestamp(run_at_to),
        )
        resp = await self._call(
            (lambda n: n.tasks.ListDead) if dead else (lambda n: n.tasks.ListTasks), req, retry=True
        )
        return Page([convert.task_from_pb(t) for t in resp.tasks], resp.next_page_token)

    async def iter_tasks(
        self,
        *,
        queue: str | None = None,
        state: TaskState | None = None,
        dead: bool = False,
        labels: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Task]:
        """Every matching task, page by page."""
        token = ""
        while True:
            page = await self.list(
                queue=queue, state=state, page_token=token, dead=dead, page_size=500, labels=labels
            )
            for task in page.tasks:
                yield task
            if not page.next_token:
                return
            token = page.next_token

    async def requeue(self, task_ids: Sequence[str]) -> builtins.list[Task]:
        req = tasks_pb2.RequeueRequest(namespace=self.namespace, ids=list(task_ids))
        resp = await self._call(lambda n: n.tasks.Requeue, req)
        return [convert.task_from_pb(t) for t in resp.tasks]

    # ------------------------------------------------------------------ schedules

    async def set_queue_limit(self, queue: str, rate: float, burst: float = 0) -> None:
        """Limit dispatch of ``queue`` to ``rate`` tasks/s across the cluster (0 removes it)."""
        req = tasks_pb2.QueueLimit(namespace=self.namespace, queue=queue, rate=rate, burst=burst)
        await self._call(lambda n: n.tasks.SetQueueLimit, req, retry=True)  # a set: repeatable

    async def queue_limits(self) -> dict[str, tuple[float, float]]:
        """Queue → (rate, burst) of this namespace's limited queues."""
        req = tasks_pb2.ListQueueLimitsRequest(namespace=self.namespace)
        resp = await self._call(lambda n: n.tasks.ListQueueLimits, req, retry=True)
        return {lim.queue: (lim.rate, lim.burst) for lim in resp.limits}

    async def count_tasks(self, states: Sequence[TaskState] = ()) -> QueueCounts:
        """This namespace's tasks by queue and state (default: scheduled, ready, running and
        dead), counted by the node from an index within its bounds (``QueueCounts`` says
        which counts are lower bounds)."""
        req = tasks_pb2.CountTasksRequest(
            namespace=self.namespace, states=[convert.state_to_pb(s) for s in states]
        )
        resp = await self._call(lambda n: n.tasks.CountTasks, req, retry=True)
        return convert.queue_counts_from_pb(resp)

    # ------------------------------------------------------------------ workers

    async def claim(
        self,
        queues: Sequence[str],
        *,
        worker_id: str = "",
        max_tasks: int = 1,
        wait: timedelta = timedelta(0),
    ) -> builtins.list[Task]:
        """Claim up to ``max_tasks`` ready tasks, waiting up to ``wait`` for one to come due."""
        req = worker_pb2.ClaimRequest(
            namespace=self.namespace,
            queues=list(queues),
            worker_id=worker_id,
            max_tasks=max_tasks,
            wait=convert.to_duration(wait),
        )
        # Not retried: a claim the node answered too late may have taken tasks (they come
        # back when their leases expire); the worker simply claims again.
        resp = await self._call(
            lambda n: n.workers.Claim, req, timeout=wait.total_seconds() + CLAIM_MARGIN
        )
        return [convert.task_from_pb(t) for t in resp.tasks]

    async def open_work(
        self,
        queues: Sequence[str],
        *,
        worker_id: str,
        credits: int,
        on_tasks: OnTasks,
    ) -> WorkStream:
        """Open a work stream on the picked node (see ``chronoq.client.stream``): the node
        pushes up to ``credits`` tasks to ``on_tasks`` without being asked again."""
        index = self._pool.pick()
        node = self._pool.nodes[index]
        stream = WorkStream(node.workers.Work(metadata=self._metadata), node.address, on_tasks)
        try:
            await stream.start(self.namespace, queues, worker_id, credits)
        except errors.Unavailable:
            self._pool.failed(index)
            await stream.close(grace=0)
            raise
        return stream

    def stream_failed(self, stream: WorkStream) -> None:
        """A stream's node failed it: pass the node over for a while, as after a failed call."""
        for index, node in enumerate(self._pool.nodes):
            if node.address == stream.address:
                self._pool.failed(index)

    async def heartbeat(self, leases: Sequence[Lease]) -> builtins.list[HeartbeatOutcome]:
        req = worker_pb2.HeartbeatRequest(
            namespace=self.namespace, leases=[convert.lease_to_pb(lease) for lease in leases]
        )
        resp = await self._call(
            lambda n: n.workers.Heartbeat, req, timeout=self.ack_timeout, retry=True
        )
        return [HeartbeatOutcome(r.task_id, r.ok, r.cancelled, r.error) for r in resp.results]

    async def complete(self, lease: Lease) -> Task:
        req = worker_pb2.CompleteRequest(namespace=self.namespace, lease=convert.lease_to_pb(lease))
        reply = await self._call(
            lambda n: n.workers.Complete, req, timeout=self.ack_timeout, retry=True
        )
        return convert.task_from_pb(reply)

    async def complete_many(self, leases: Sequence[Lease]) -> builtins.list[AckOutcome]:
        req = worker_pb2.CompleteBatchRequest(
            namespace=self.namespace, leases=[convert.lease_to_pb(lease) for lease in leases]
        )
        resp = await self._call(
            lambda n: n.workers.CompleteBatch, req, timeout=self.ack_timeout, retry=True
        )
        return [AckOutcome(r.task_id, r.ok, r.error) for r in resp.results]

    async def complete_and_claim(
        self,
        leases: Sequence[Lease],
        queues: Sequence[str],
        *,
        worker_id: str = "",
        max_tasks: int = 1,
    ) -> tuple[builtins.list[AckOutcome], builtins.list[Task]]:
        """``complete_many``, then claim up to ``max_tasks`` at once in the same call.

        A node that predates the riding claim answers the acks and claims nothing; so does a
        node whose claim failed (the acks are answered either way).
        """
        req = worker_pb2.CompleteBatchRequest(
            namespace=self.namespace,
            leases=[convert.lease_to_pb(lease) for lease in leases],
            claim=worker_pb2.ClaimRequest(
                namespace=self.namespace,
                queues=list(queues),
                worker_id=worker_id,
                max_tasks=max_tasks,
            ),
        )
        resp = await self._call(
            lambda n: n.workers.CompleteBatch, req, timeout=self.ack_timeout, retry=True
        )
        return (
            [AckOutcome(r.task_id, r.ok, r.error) for r in resp.results],
            [convert.task_from_pb(t) for t in resp.claimed],
        )

    async def fail(
        self,
        lease: Lease,
        error: str,
        *,
        fatal: bool = False,
        retry_after: timedelta | None = None,
    ) -> Task:
        req = worker_pb2.FailRequest(
            namespace=self.namespace, lease=convert.lease_to_pb(lease), error=error, fatal=fatal
        )
        if retry_after is not None:
            req.retry_after.FromTimedelta(retry_after)
        reply = await self._call(
            lambda n: n.workers.Fail, req, timeout=self.ack_timeout, retry=True
        )
        return convert.task_from_pb(reply)

    async def release(self, lease: Lease) -> Task:
        req = worker_pb2.ReleaseRequest(namespace=self.namespace, lease=convert.lease_to_pb(lease))
        reply = await self._call(
            lambda n: n.workers.Release, req, timeout=self.ack_timeout, retry=True
        )
        return convert.task_from_pb(reply)


def _ours(spec: tasks_pb2.TaskSpec) -> tuple[tasks_pb2.TaskSpec, bool]:
    """A spec keyed by the client, and whether any answer to it is a task this call made."""
    return spec, not (spec.unique_key or spec.debounce_key)


async def _landed(start: int, call: Awaitable[builtins.list[R]], total: int) -> builtins.list[R]:
    """The answer of the part of a long submit that starts at task ``start``; its error says
    where the part is (the node counts its tasks from 0)."""
    try:
        return await call
    except errors.RemoteError as exc:
        if start == 0:
            raise
        end = min(start + SUBMIT_PART, total)
        raise type(exc)(
            f"{exc} (in the request of tasks {start}..{end - 1} of {total}, counted from "
            f"{start}; the {start} tasks before it were accepted, those sent beside it may "
            "have been)",
            exc.code,
        ) from exc


def answer_sized(
    keyed: Sequence[tuple[tasks_pb2.TaskSpec, K]],
) -> builtins.list[Sequence[tuple[tasks_pb2.TaskSpec, K]]]:
    """``keyed`` cut into consecutive batches whose full ``SubmitBatch`` answer fits in the
    node's answer budget (``chronoq.limits.check_full_answer``; each spec counted with its
    framing), one task at least each."""
    parts: builtins.list[Sequence[tuple[tasks_pb2.TaskSpec, K]]] = []
    start, size = 0, 0
    for i, (spec, _) in enumerate(keyed):
        cost = full_answer_bytes(spec.ByteSize() + SPEC_FRAMING_BYTES, 1)
        if i > start and size + cost > MAX_ANSWER_BYTES:
            parts.append(keyed[start:i])
            start, size = i, 0
        size += cost
    if start < len(keyed) or not parts:
        parts.append(keyed[start:])
    return parts


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """The ``authorization`` metadata for a bearer token (gRPC metadata is printable ASCII)."""
    if not token:
        return None
    if not token.isascii() or not token.isprintable() or " " in token:
        raise errors.ConfigError("token: must be printable ASCII without spaces")
    return (("authorization", f"Bearer {token}"),)
