"""A blocking client for code without an event loop: Django and Flask views, scripts, notebooks.

``SyncClient`` runs the async ``Client`` on an event loop of its own, in one private thread,
and blocks the calling thread until each call's answer. So every call, deadline, failover and
error is exactly the async client's (the same code runs; nothing is restated), one set of
channels serves every thread, and the caller needs no loop. grpc's blocking stubs were the
other choice: they would have needed a second copy of the failover, health following and
error translation, which would drift from the first.

Safe to share between threads: calls from several threads at once run concurrently on the
private loop. One instance per process is the intended use; ``close()`` (or ``with``) ends
its thread.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from chronoq import errors
from chronoq.client.client import Client
from chronoq.client.values import AddedShard, ClusterStatus, MoveStatus, NewTask, Submitted
from chronoq.models import (
    DEFAULT_NAMESPACE,
    TASK_DEFAULTS,
    AckOutcome,
    HeartbeatOutcome,
    Lease,
    Page,
    QueueCounts,
    Schedule,
    Task,
    TaskState,
)
from chronoq.queue_settings import QueueResumed, QueueSettings
from chronoq.queuecounts import QueueSnapshot
from chronoq.recurrence import CatchUp
from chronoq.taskfilter import BulkOutcome

T = TypeVar("T")

#: Seconds ``close()`` waits for the private loop's thread to end.
CLOSE_JOIN_TIMEOUT = 10.0


class SyncClient:
    """The ``Client``'s calls, blocking: ``with SyncClient("127.0.0.1:7070") as client:
    client.submit("emails", payload={"to": "a@example.com"})``.

    Takes the same arguments as ``Client`` and raises the same errors (``BadRequest``,
    ``NotFound``, ``Unavailable``, ...). Every method of ``Client`` exists here with the
    same signature, returning the value instead of an awaitable.
    """

    def __init__(
        self,
        target: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        timeout: float = 30.0,
        token: str | None = None,
        tls: bool = False,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="chronoq-sync-client", daemon=True
        )
        self._thread.start()
        self._closed = False
        self._close_lock = threading.Lock()

        async def open_client() -> Client:
            # gRPC's asyncio channels belong to the loop they are made on: make them on ours.
            return Client(
                target,
                namespace=namespace,
                timeout=timeout,
                token=token,
                tls=tls,
                tls_ca=tls_ca,
                tls_cert=tls_cert,
                tls_key=tls_key,
            )

        try:
            self._client = self._run(open_client())
        except BaseException:
            self._stop_loop()
            raise

    # ------------------------------------------------------------------ plumbing

    def _future(self, call: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            call.close()
            raise errors.ConfigError("this SyncClient is closed")
        if threading.current_thread() is self._thread:
            call.close()  # would wait for itself forever
            raise errors.ConfigError("a SyncClient cannot be called from its own loop")
        return asyncio.run_coroutine_threadsafe(call, self._loop)

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run ``call`` on the private loop and wait for its result (or its error)."""
        future = self._future(call)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt: do not leave the call running
            raise

    def run_async(self, call: Callable[[Client], Awaitable[T]]) -> Awaitable[T]:
        """``call(client)`` on the private loop, awaited from another loop without blocking
        it: lets async code (an ASGI app) share this client, e.g.
        ``await sync.run_async(lambda c: c.submit("emails"))``."""

        async def run() -> T:
            return await call(self._client)

        return asyncio.wrap_future(self._future(run()))

    @property
    def client(self) -> Client:
        """The async client underneath (use it only on this client's loop, via ``run_async``)."""
        return self._client

    @property
    def target(self) -> str:
        return self._client.target

    @property
    def namespace(self) -> str:
        return self._client.namespace

    @property
    def failovers(self) -> int:
        """Calls retried on another node."""
        return self._client.failovers

    @property
    def addresses(self) -> builtins.list[str]:
        return self._client.addresses

    def close(self) -> None:
        """Close the channels and end the private thread; later calls raise ``ConfigError``."""
        with self._close_lock:
            if self._closed:
                return
            try:
                self._run(self._client.close())
            finally:
                self._closed = True
                self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_JOIN_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        self._run(self._client.wait_ready(timeout))

    # ------------------------------------------------------------------ tasks

    def submit(self, queue: str, **fields: Any) -> Submitted:
        """Submit one task; see ``NewTask`` for the fields (run_at or delay, payload, ...)."""
        return self._run(self._client.submit(queue, **fields))

    async def asubmit(self, queue: str, **fields: Any) -> Submitted:
        """``submit`` awaited from async code, without blocking its loop."""
        return await self.run_async(lambda c: c.submit(queue, **fields))

    def submit_many(self, tasks: Sequence[NewTask]) -> builtins.list[Submitted]:
        return self._run(self._client.submit_many(tasks))

    def submit_ids(self, tasks: Sequence[NewTask]) -> builtins.list[tuple[str, bool]]:
        return self._run(self._client.submit_ids(tasks))

    def get(self, task_id: str) -> Task:
        return self._run(self._client.get(task_id))

    def cancel(self, task_id: str) -> Task:
        return self._run(self._client.cancel(task_id))

    def list(
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
        return self._run(
            self._client.list(
                queue=queue,
                state=state,
                page_size=page_size,
                page_token=page_token,
                dead=dead,
                labels=labels,
                run_at_from=run_at_from,
                run_at_to=run_at_to,
            )
        )

    def iter_tasks(
        self,
        *,
        queue: str | None = None,
        state: TaskState | None = None,
        dead: bool = False,
        labels: Mapping[str, str] | None = None,
    ) -> Iterator[Task]:
        """Every matching task, page by page (a page is fetched when the previous one ends)."""
        token = ""
        while True:
            page = self.list(
                queue=queue, state=state, page_token=token, dead=dead, page_size=500, labels=labels
            )
            yield from page.tasks
            if not page.next_token:
                return
            token = page.next_token

    def requeue(self, task_ids: Sequence[str]) -> builtins.list[Task]:
        return self._run(self._client.requeue(task_ids))

    def cancel_where(
        self,
        *,
        queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        state: TaskState | None = None,
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
        dry_run: bool = False,
        max_tasks: int | None = None,
    ) -> BulkOutcome:
        """``Client.cancel_where``."""
        return self._run(
            self._client.cancel_where(
                queue=queue,
                labels=labels,
                state=state,
                run_at_from=run_at_from,
                run_at_to=run_at_to,
                dry_run=dry_run,
                max_tasks=max_tasks,
            )
        )

    def requeue_where(
        self,
        *,
        queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
        dry_run: bool = False,
        max_tasks: int | None = None,
    ) -> BulkOutcome:
        """``Client.requeue_where``."""
        return self._run(
            self._client.requeue_where(
                queue=queue,
                labels=labels,
                run_at_from=run_at_from,
                run_at_to=run_at_to,
                dry_run=dry_run,
                max_tasks=max_tasks,
            )
        )

    def run_now_where(
        self,
        *,
        queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        run_at_from: datetime | None = None,
        run_at_to: datetime | None = None,
        dry_run: bool = False,
        max_tasks: int | None = None,
    ) -> BulkOutcome:
        """``Client.run_now_where``."""
        return self._run(
            self._client.run_now_where(
                queue=queue,
                labels=labels,
                run_at_from=run_at_from,
                run_at_to=run_at_to,
                dry_run=dry_run,
                max_tasks=max_tasks,
            )
        )

    # ------------------------------------------------------------------ schedules

    def create_schedule(
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
        priority: int = TASK_DEFAULTS.priority,
        max_attempts: int | None = None,
        lease_timeout: timedelta | None = None,
    ) -> Schedule:
        return self._run(
            self._client.create_schedule(
                name,
                queue,
                cron=cron,
                every=every,
                timezone=timezone,
                start_at=start_at,
                catch_up=catch_up,
                payload=payload,
                priority=priority,
                max_attempts=max_attempts,
                lease_timeout=lease_timeout,
            )
        )

    def get_schedule(self, name: str) -> Schedule:
        return self._run(self._client.get_schedule(name))

    def list_schedules(self) -> builtins.list[Schedule]:
        return self._run(self._client.list_schedules())

    def pause_schedule(self, name: str) -> Schedule:
        return self._run(self._client.pause_schedule(name))

    def resume_schedule(self, name: str) -> Schedule:
        return self._run(self._client.resume_schedule(name))

    def delete_schedule(self, name: str) -> None:
        self._run(self._client.delete_schedule(name))

    def set_queue_limit(self, queue: str, rate: float, burst: float = 0) -> None:
        self._run(self._client.set_queue_limit(queue, rate, burst))

    def queue_limits(self) -> dict[str, tuple[float, float]]:
        return self._run(self._client.queue_limits())

    def set_queue(
        self,
        queue: str,
        *,
        max_running_per_key: int | None = None,
        max_starts_per_key: float | None = None,
    ) -> QueueSettings:
        """``Client.set_queue``, blocking."""
        return self._run(
            self._client.set_queue(
                queue,
                max_running_per_key=max_running_per_key,
                max_starts_per_key=max_starts_per_key,
            )
        )

    def pause_queue(self, queue: str) -> QueueSettings:
        """``Client.pause_queue``, blocking."""
        return self._run(self._client.pause_queue(queue))

    def resume_queue(self, queue: str) -> QueueResumed:
        """``Client.resume_queue``, blocking."""
        return self._run(self._client.resume_queue(queue))

    def queue_settings(self, queue: str) -> QueueSettings:
        """``Client.queue_settings``, blocking."""
        return self._run(self._client.queue_settings(queue))

    def list_queue_settings(self) -> builtins.list[QueueSettings]:
        """``Client.list_queue_settings``, blocking."""
        return self._run(self._client.list_queue_settings())

    def count_tasks(self, states: Sequence[TaskState] = ()) -> QueueCounts:
        return self._run(self._client.count_tasks(states))

    def queue_counts(
        self, queues: Sequence[str] = (), *, label_key: str | None = None
    ) -> QueueSnapshot:
        """``Client.queue_counts``, blocking."""
        return self._run(self._client.queue_counts(queues, label_key=label_key))

    def drain(self) -> builtins.list[int]:
        return self._run(self._client.drain())

    def status(self, bucket_horizon: int = 10) -> ClusterStatus:
        return self._run(self._client.status(bucket_horizon))

    def add_shard(self, dsn: str) -> AddedShard:
        return self._run(self._client.add_shard(dsn))

    def move_partitions(self, partitions: str, target: str) -> builtins.list[MoveStatus]:
        return self._run(self._client.move_partitions(partitions, target))

    def rebalance(self, *, dry_run: bool = False) -> builtins.list[MoveStatus]:
        return self._run(self._client.rebalance(dry_run=dry_run))

    # ------------------------------------------------------------------ workers

    def claim(
        self,
        queues: Sequence[str],
        *,
        worker_id: str = "",
        max_tasks: int = 1,
        wait: timedelta = timedelta(0),
    ) -> builtins.list[Task]:
        return self._run(
            self._client.claim(queues, worker_id=worker_id, max_tasks=max_tasks, wait=wait)
        )

    def heartbeat(self, leases: Sequence[Lease]) -> builtins.list[HeartbeatOutcome]:
        return self._run(self._client.heartbeat(leases))

    def complete(self, lease: Lease) -> Task:
        return self._run(self._client.complete(lease))

    def complete_many(self, leases: Sequence[Lease]) -> builtins.list[AckOutcome]:
        return self._run(self._client.complete_many(leases))

    def complete_and_claim(
        self,
        leases: Sequence[Lease],
        queues: Sequence[str],
        *,
        worker_id: str = "",
        max_tasks: int = 1,
    ) -> tuple[builtins.list[AckOutcome], builtins.list[Task]]:
        return self._run(
            self._client.complete_and_claim(
                leases, queues, worker_id=worker_id, max_tasks=max_tasks
            )
        )

    def fail(
        self,
        lease: Lease,
        error: str,
        *,
        fatal: bool = False,
        retry_after: timedelta | None = None,
    ) -> Task:
        return self._run(self._client.fail(lease, error, fatal=fatal, retry_after=retry_after))

    def release(self, lease: Lease) -> Task:
        return self._run(self._client.release(lease))
