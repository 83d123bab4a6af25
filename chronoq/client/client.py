"""The async Python client of a chronoq node. Protobuf stays inside; models come out."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import grpc

from chronoq import errors
from chronoq.api import convert
from chronoq.api.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from chronoq.models import (
    DEFAULT_NAMESPACE,
    AckOutcome,
    HeartbeatOutcome,
    Lease,
    MisfirePolicy,
    Page,
    Schedule,
    Task,
    TaskState,
)
from chronoq.recurrence import CatchUp
from chronoq.targets import first_host, grpc_target, is_several
from chronoq.tls import channel_credentials

_ERRORS: dict[grpc.StatusCode, type[errors.RemoteError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.BadRequest,
    grpc.StatusCode.OUT_OF_RANGE: errors.BadRequest,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.PreconditionFailed,
    grpc.StatusCode.FAILED_PRECONDITION: errors.PreconditionFailed,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.UNAUTHENTICATED: errors.AccessDenied,
    grpc.StatusCode.PERMISSION_DENIED: errors.AccessDenied,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.Unavailable,
}

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class NewTask:
    """A task to submit; unset fields take the node's defaults."""

    queue: str
    run_at: datetime | None = None
    delay: timedelta | None = None
    payload: bytes = b""
    idempotency_key: str | None = None
    max_attempts: int | None = None
    backoff_initial: timedelta | None = None
    backoff_max: timedelta | None = None
    lease_timeout: timedelta | None = None
    priority: int = 0
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_LATE
    misfire_grace: timedelta | None = None

    def to_pb(self, namespace: str) -> tasks_pb2.TaskSpec:
        pb = tasks_pb2.TaskSpec(
            namespace=namespace,
            queue=self.queue,
            payload=self.payload,
            idempotency_key=self.idempotency_key or "",
            priority=self.priority,
            misfire_policy=convert.state_policy_to_pb(self.misfire_policy),
        )
        if self.run_at is not None and self.delay is not None:
            raise errors.BadRequest("set run_at or delay, not both", "INVALID_ARGUMENT")
        if self.run_at is not None:
            pb.run_at.FromDatetime(self.run_at)
        elif self.delay is not None:
            pb.delay.FromTimedelta(self.delay)
        else:
            pb.delay.FromTimedelta(timedelta(0))
        if self.max_attempts is not None:
            if self.max_attempts < 0:
                raise errors.BadRequest("max_attempts: must be >= 1", "INVALID_ARGUMENT")
            pb.retry.max_attempts = self.max_attempts
        if self.backoff_initial is not None:
            pb.retry.backoff_initial.FromTimedelta(self.backoff_initial)
        if self.backoff_max is not None:
            pb.retry.backoff_max.FromTimedelta(self.backoff_max)
        if self.lease_timeout is not None:
            pb.lease_timeout.FromTimedelta(self.lease_timeout)
        if self.misfire_grace is not None:
            pb.misfire_grace.FromTimedelta(self.misfire_grace)
        return pb


@dataclass(frozen=True)
class Submitted:
    task: Task
    created: bool  # False: an earlier submit with the same idempotency key won


@dataclass(frozen=True)
class BucketCount:
    bucket: int
    starts_at: datetime
    pending: int


@dataclass(frozen=True)
class MemberStatus:
    node_id: str
    address: str
    owned_partitions: int
    lateness_p50_ms: float
    lateness_p99_ms: float
    fired_total: int


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    owner: str
    fencing_token: int
    watermark_bucket: int


@dataclass(frozen=True)
class ClusterStatus:
    cluster: str
    node_id: str
    now: datetime
    partitions: int
    bucket_seconds: int
    members: list[MemberStatus] = field(default_factory=list)
    ownership: list[PartitionStatus] = field(default_factory=list)
    buckets: list[BucketCount] = field(default_factory=list)
    firing_partitions: list[int] = field(default_factory=list)  # what this node fires now


def translate(exc: grpc.aio.AioRpcError) -> errors.RemoteError:
    """A gRPC error as the chronoq error of its status code."""
    code = exc.code()
    cls = _ERRORS.get(code, errors.RemoteError)
    return cls(f"{code.name}: {exc.details() or 'no details'}", code.name)


class Client:
    """Talks to one node (any node of a cluster serves every call).

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
        """``target``: a node's ``host:port``, or several comma-separated: calls then go round
        robin over the nodes that answer, so a dead node costs at most the calls in flight to
        it (any node serves any call). A gRPC target (``dns:///name:7070``) is used as is.

        ``token``: bearer token for nodes with ``auth_tokens``. TLS when ``tls`` or any
        ``tls_*`` is given: ``tls_ca`` is the CA to trust (None: the system's roots),
        ``tls_cert``/``tls_key`` a client certificate for nodes that require mutual TLS; with
        several addresses every node's certificate must name the first address's host."""
        self.target = target
        self.namespace = namespace
        self.timeout = timeout
        self._metadata = bearer_metadata(token)
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
        ]
        resolved = grpc_target(target, what="node address") if channel is None else target
        secure = tls or tls_ca or tls_cert or tls_key
        if is_several(resolved):
            options.append(("grpc.lb_policy_name", "round_robin"))
            if secure:
                options.append(("grpc.ssl_target_name_override", first_host(target)))
        if channel is None and secure:
            credentials = channel_credentials(tls_ca, tls_cert, tls_key)
            channel = grpc.aio.secure_channel(resolved, credentials, options=options)
        self._channel = channel or grpc.aio.insecure_channel(resolved, options=options)
        self._tasks = tasks_pb2_grpc.TaskServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._workers = worker_pb2_grpc.WorkerServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._cluster = cluster_pb2_grpc.ClusterServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._schedules = schedules_pb2_grpc.ScheduleServiceStub(self._channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until the channel connects (the node is up)."""
        try:
            await _wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise errors.Unavailable(
                f"no chronoq node answered at {self.target} within {timeout} s"
            ) from None

    async def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return await method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc) from exc

    # ------------------------------------------------------------------ tasks

    async def submit(self, queue: str, **fields: Any) -> Submitted:
        """Submit one task; see ``NewTask`` for the fields (run_at or delay, payload, ...)."""
        pb = NewTask(queue=queue, **fields).to_pb(self.namespace)
        resp = await self._call(self._tasks.Submit, tasks_pb2.SubmitRequest(task=pb))
        return Submitted(convert.task_from_pb(resp.task), resp.created)

    async def submit_many(self, tasks: Sequence[NewTask]) -> builtins.list[Submitted]:
        """Submit a batch in one request and one transaction; results in request order."""
        req = tasks_pb2.SubmitBatchRequest(tasks=[t.to_pb(self.namespace) for t in tasks])
        resp = await self._call(self._tasks.SubmitBatch, req)
        return [
            Submitted(convert.task_from_pb(t), c)
            for t, c in zip(resp.tasks, resp.created, strict=True)
        ]

    async def submit_ids(self, tasks: Sequence[NewTask]) -> builtins.list[tuple[str, bool]]:
        """Like ``submit_many`` but answered with (task id, created) pairs only: for bulk loads,
        where echoing every task back would cost more than inserting it."""
        req = tasks_pb2.SubmitBatchRequest(
            tasks=[t.to_pb(self.namespace) for t in tasks], ids_only=True
        )
        resp = await self._call(self._tasks.SubmitBatch, req)
        return list(zip(resp.ids, resp.created, strict=True))

    async def get(self, task_id: str) -> Task:
        req = tasks_pb2.GetTaskRequest(namespace=self.namespace, id=task_id)
        return convert.task_from_pb(await self._call(self._tasks.GetTask, req))

    async def cancel(self, task_id: str) -> Task:
        req = tasks_pb2.CancelTaskRequest(namespace=self.namespace, id=task_id)
        return convert.task_from_pb(await self._call(self._tasks.CancelTask, req))

    async def list(
        self,
        *,
        queue: str | None = None,
        state: TaskState | None = None,
        page_size: int = 100,
        page_token: str = "",
        dead: bool = False,
    ) -> Page:
        req = tasks_pb2.ListTasksRequest(
            namespace=self.namespace,
            queue=queue or "",
            page_size=page_size,
            page_token=page_token,
            state=convert.state_to_pb(state)
            if state is not None
            else tasks_pb2.TASK_STATE_UNSPECIFIED,
        )
        method = self._tasks.ListDead if dead else self._tasks.ListTasks
        resp = await self._call(method, req)
        return Page([convert.task_from_pb(t) for t in resp.tasks], resp.next_page_token)

    async def iter_tasks(
        self, *, queue: str | None = None, state: TaskState | None = None, dead: bool = False
    ) -> AsyncIterator[Task]:
        """Every matching task, page by page."""
        token = ""
        while True:
            page = await self.list(
                queue=queue, state=state, page_token=token, dead=dead, page_size=500
            )
            for task in page.tasks:
                yield task
            if not page.next_token:
                return
            token = page.next_token

    async def requeue(self, task_ids: Sequence[str]) -> builtins.list[Task]:
        req = tasks_pb2.RequeueRequest(namespace=self.namespace, ids=list(task_ids))
        resp = await self._call(self._tasks.Requeue, req)
        return [convert.task_from_pb(t) for t in resp.tasks]

    # ------------------------------------------------------------------ schedules

    async def create_schedule(
        self,
        name: str,
        queue: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str = "UTC",
        start_at: datetime | None = None,
        catch_up: CatchUp = CatchUp.LATEST,
        payload: bytes = b"",
        priority: int = 0,
        max_attempts: int | None = None,
        lease_timeout: timedelta | None = None,
    ) -> Schedule:
        """A recurring schedule: ``cron`` (5 fields, in ``timezone``) or ``every`` (interval)."""
        if (cron is None) == (every is None):
            raise errors.BadRequest("set exactly one of cron and every", "INVALID_ARGUMENT")
        pb = schedules_pb2.ScheduleSpec(
            namespace=self.namespace,
            name=name,
            queue=queue,
            timezone=timezone,
            payload=payload,
            priority=priority,
            catch_up=convert.catch_up_to_pb(catch_up),
        )
        if cron is not None:
            pb.cron = cron
        if every is not None:
            pb.interval.FromTimedelta(every)
        if start_at is not None:
            pb.start_at.FromDatetime(start_at)
        if max_attempts is not None:
            pb.retry.max_attempts = max_attempts
        if lease_timeout is not None:
            pb.lease_timeout.FromTimedelta(lease_timeout)
        return convert.schedule_from_pb(await self._call(self._schedules.CreateSchedule, pb))

    def _ref(self, name: str) -> schedules_pb2.ScheduleRef:
        return schedules_pb2.ScheduleRef(namespace=self.namespace, name=name)

    async def get_schedule(self, name: str) -> Schedule:
        pb = await self._call(self._schedules.GetSchedule, self._ref(name))
        return convert.schedule_from_pb(pb)

    async def list_schedules(self) -> builtins.list[Schedule]:
        out: builtins.list[Schedule] = []
        token = ""
        while True:
            req = schedules_pb2.ListSchedulesRequest(namespace=self.namespace, page_token=token)
            resp = await self._call(self._schedules.ListSchedules, req)
            out += [convert.schedule_from_pb(s) for s in resp.schedules]
            if not resp.next_page_token:
                return out
            token = resp.next_page_token

    async def pause_schedule(self, name: str) -> Schedule:
        pb = await self._call(self._schedules.PauseSchedule, self._ref(name))
        return convert.schedule_from_pb(pb)

    async def resume_schedule(self, name: str) -> Schedule:
        pb = await self._call(self._schedules.ResumeSchedule, self._ref(name))
        return convert.schedule_from_pb(pb)

    async def delete_schedule(self, name: str) -> None:
        await self._call(self._schedules.DeleteSchedule, self._ref(name))

    async def set_queue_limit(self, queue: str, rate: float, burst: float = 0) -> None:
        """Limit dispatch of ``queue`` to ``rate`` tasks/s across the cluster (0 removes it)."""
        req = tasks_pb2.QueueLimit(namespace=self.namespace, queue=queue, rate=rate, burst=burst)
        await self._call(self._tasks.SetQueueLimit, req)

    async def queue_limits(self) -> dict[str, tuple[float, float]]:
        """Queue → (rate, burst) of this namespace's limited queues."""
        req = tasks_pb2.ListQueueLimitsRequest(namespace=self.namespace)
        resp = await self._call(self._tasks.ListQueueLimits, req)
        return {lim.queue: (lim.rate, lim.burst) for lim in resp.limits}

    async def drain(self) -> builtins.list[int]:
        """Ask this node to hand off its partitions and take no more; returns them."""
        resp = await self._call(self._cluster.Drain, cluster_pb2.DrainRequest())
        return list(resp.released)

    async def status(self, bucket_horizon: int = 10) -> ClusterStatus:
        resp = await self._call(
            self._cluster.Status, cluster_pb2.StatusRequest(bucket_horizon=bucket_horizon)
        )
        return ClusterStatus(
            cluster=resp.cluster,
            node_id=resp.node_id,
            now=convert.from_timestamp("now", resp.now),
            partitions=resp.partitions,
            bucket_seconds=resp.bucket_seconds,
            members=[
                MemberStatus(
                    m.node_id,
                    m.address,
                    m.owned_partitions,
                    m.lateness_p50_ms,
                    m.lateness_p99_ms,
                    m.fired_total,
                )
                for m in resp.members
            ],
            ownership=[
                PartitionStatus(o.partition, o.owner, o.fencing_token, o.watermark_bucket)
                for o in resp.ownership
            ],
            buckets=[
                BucketCount(b.bucket, convert.from_timestamp("starts_at", b.starts_at), b.pending)
                for b in resp.buckets
            ],
            firing_partitions=list(resp.firing_partitions),
        )

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
        resp = await self._call(
            self._workers.Claim, req, timeout=self.timeout + wait.total_seconds()
        )
        return [convert.task_from_pb(t) for t in resp.tasks]

    async def heartbeat(self, leases: Sequence[Lease]) -> builtins.list[HeartbeatOutcome]:
        req = worker_pb2.HeartbeatRequest(
            namespace=self.namespace, leases=[convert.lease_to_pb(lease) for lease in leases]
        )
        resp = await self._call(self._workers.Heartbeat, req)
        return [HeartbeatOutcome(r.task_id, r.ok, r.cancelled, r.error) for r in resp.results]

    async def complete(self, lease: Lease) -> Task:
        req = worker_pb2.CompleteRequest(namespace=self.namespace, lease=convert.lease_to_pb(lease))
        return convert.task_from_pb(await self._call(self._workers.Complete, req))

    async def complete_many(self, leases: Sequence[Lease]) -> builtins.list[AckOutcome]:
        req = worker_pb2.CompleteBatchRequest(
            namespace=self.namespace, leases=[convert.lease_to_pb(lease) for lease in leases]
        )
        resp = await self._call(self._workers.CompleteBatch, req)
        return [AckOutcome(r.task_id, r.ok, r.error) for r in resp.results]

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
        return convert.task_from_pb(await self._call(self._workers.Fail, req))

    async def release(self, lease: Lease) -> Task:
        req = worker_pb2.ReleaseRequest(namespace=self.namespace, lease=convert.lease_to_pb(lease))
        return convert.task_from_pb(await self._call(self._workers.Release, req))


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """The ``authorization`` metadata for a bearer token (gRPC metadata is printable ASCII)."""
    if not token:
        return None
    if not token.isascii() or not token.isprintable() or " " in token:
        raise errors.ConfigError("token: must be printable ASCII without spaces")
    return (("authorization", f"Bearer {token}"),)


async def _wait_for(awaitable: Any, timeout: float) -> Any:
    import asyncio

    return await asyncio.wait_for(awaitable, timeout)
