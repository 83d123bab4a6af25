"""Domain errors: one base class, typed fields, the docstring as default message.

Adapters translate driver errors into these at the edge (store, coordinator). Each class
declares its gRPC status code once, by name (so this module imports no grpc), and both
directions of the mapping derive from those declarations: a node answers a domain error with
its class's ``grpc_code`` (``chronoq.node.edge.status``), and a client raises the ``RemoteError``
subclass that lists the code it received in ``grpc_codes`` (``remote_error_class``).
"""

from __future__ import annotations

from typing import ClassVar

INTERNAL = "INTERNAL"
"""The status of an error that declares no code of its own: a bug of the node."""


class ChronoqError(Exception):
    """Something went wrong in chronoq."""

    grpc_code: ClassVar[str] = INTERNAL
    """The name of the gRPC status code a node answers with when a call fails with this."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


#: Characters of a refused value that an error message quotes back: enough to recognise it,
#: never the 100 KB a caller sent (a client drops a status whose message is too large).
ECHO_LIMIT = 64
#: Characters of an error message at most, whatever it quotes.
MESSAGE_LIMIT = 1024


def shown(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` cut at ``limit`` characters with an ellipsis, for error messages."""
    if isinstance(value, str | bytes) and len(value) > 4 * limit:
        value = value[: 4 * limit]  # repr of a huge value is not worth building
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class InvalidArgument(ChronoqError):
    """A request field is missing or out of range."""

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        message = f"{field}: {problem}"
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 1] + "\u2026"
        super().__init__(message)


class PayloadNotJSON(InvalidArgument):
    """A payload cannot be encoded as JSON, or a JSON payload does not decode; ``field`` says
    where in the value (``payload['when']``). Raised by the client: nothing was sent."""


class TaskNotFound(ChronoqError):
    """No task with this id in this namespace."""

    grpc_code = "NOT_FOUND"

    def __init__(self, task_id: str, namespace: str = "default") -> None:
        self.task_id = task_id
        self.namespace = namespace
        super().__init__(f"no task {task_id!r} in namespace {namespace!r}")


class ScheduleNotFound(ChronoqError):
    """No schedule with this name in this namespace."""

    grpc_code = "NOT_FOUND"

    def __init__(self, name: str, namespace: str = "default") -> None:
        self.name = name
        self.namespace = namespace
        super().__init__(f"no schedule {name!r} in namespace {namespace!r}")


class AlreadyExists(ChronoqError):
    """Something with this name exists already."""

    grpc_code = "ALREADY_EXISTS"


class StaleLease(ChronoqError):
    """The lease token does not match the task's current attempt, or the task is not running."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, task_id: str, lease_token: int, detail: str) -> None:
        self.task_id = task_id
        self.lease_token = lease_token
        super().__init__(f"task {task_id}: lease token {lease_token} refused: {detail}")


class InvalidTransition(ChronoqError):
    """The task is not in a state that allows this change."""

    grpc_code = "FAILED_PRECONDITION"

    def __init__(self, task_id: str, state: str, action: str) -> None:
        self.task_id = task_id
        self.state = state
        self.action = action
        super().__init__(f"cannot {action} task {task_id}: it is {state}")


class UniqueKeyTaken(InvalidTransition):
    """A dead task cannot go back to pending beside the pending task of its unique key."""

    def __init__(self, task_id: str, unique_key: str, holder: str) -> None:
        self.task_id = task_id
        self.unique_key = unique_key
        self.holder = holder
        ChronoqError.__init__(
            self,
            f"cannot requeue task {task_id}: its unique_key {unique_key!r} is held by pending "
            f"task {holder}; cancel that task or wait until it finishes; nothing was requeued",
        )


class QuotaExceeded(ChronoqError):
    """A namespace submitted faster than its quota allows."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, namespace: str, rate: float, retry_after: float) -> None:
        self.namespace = namespace
        self.retry_after = retry_after
        wait = "the batch is larger than the burst" if retry_after == float("inf") else (
            f"retry after {retry_after * 1000:.0f} ms"
        )
        super().__init__(
            f"namespace {namespace!r} exceeded its submit quota of {rate:g} tasks/s; {wait}"
        )


class NamespaceCapReached(ChronoqError):
    """A namespace holds as many schedules (or queue limits) as a namespace may."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, namespace: str, what: str, cap: int) -> None:
        self.namespace = namespace
        self.what = what  # "schedules" or "queue limits"
        self.cap = cap
        super().__init__(
            f"namespace {namespace!r} has {cap} {what}, the most a namespace may have: "
            f"delete one first, or ask the operator to raise the cap"
        )


class ScheduleQuotaExceeded(ChronoqError):
    """A namespace's active schedules together would make more tasks than its submit quota."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, namespace: str, reserved: float, added: float, quota: float) -> None:
        self.namespace = namespace
        self.reserved = reserved  # tasks/s the namespace's active schedules can make already
        self.added = added  # tasks/s this schedule can make
        self.quota = quota
        super().__init__(
            f"namespace {namespace!r} exceeded its submit quota of {quota:g} tasks/s: its "
            f"active schedules make up to {reserved:.4g} tasks/s and this one would add "
            f"{added:.4g}; use a longer interval, or pause or delete another schedule"
        )


class StoreUnavailable(ChronoqError):
    """The task store (PostgreSQL) cannot be reached or refused the statement."""

    grpc_code = "UNAVAILABLE"


class CoordinatorUnavailable(ChronoqError):
    """The coordinator (etcd) cannot be reached in time."""

    grpc_code = "UNAVAILABLE"


class ShardUnavailable(StoreUnavailable):
    """One store shard cannot be reached; ``shard`` names it (the others may answer)."""

    def __init__(self, shard: str, message: str) -> None:
        self.shard = shard
        super().__init__(f"store {shard}: {message}")


class PartitionMoved(StoreUnavailable):
    """The store shard does not hold these partitions live at the caller's map version (a
    move is freezing them, or moved them away): nothing of the statement was written. The
    caller refreshes its shard map and retries on the shard that holds them now."""

    def __init__(self, partitions: tuple[int, ...], map_version: int | None = None) -> None:
        self.partitions = partitions
        self.map_version = map_version
        shown_parts = ", ".join(str(p) for p in partitions[:8]) + (
            f" (and {len(partitions) - 8} more)" if len(partitions) > 8 else ""
        )
        noun = "partition" if len(partitions) == 1 else "partitions"
        verb = "is" if len(partitions) == 1 else "are"
        super().__init__(
            f"{noun} {shown_parts} {verb} moving to another store shard; retry (nothing of "
            "this write was made; a submit with its idempotency key is safe to repeat)"
        )


class BatchPartlyAccepted(StoreUnavailable):
    """A batch spanning store shards was committed on some of them only (an outage or a
    move on the others). ``accepted``: (position in the batch, task id, created) of each task
    written; the others were not. Repeating the whole batch with the same keys accepts the
    rest and duplicates nothing."""

    def __init__(
        self, accepted: tuple[tuple[int, str, bool], ...], total: int, shards: tuple[str, ...]
    ) -> None:
        self.accepted = accepted
        self.total = total
        self.shards = shards
        shown_ids = ", ".join(task_id for _i, task_id, _c in accepted[:4])
        more = ", ..." if len(accepted) > 4 else ""
        super().__init__(
            f"{len(accepted)} of {total} tasks accepted ({shown_ids}{more}); store "
            f"{', '.join(shards)} did not answer: outcome unknown for the rest; safe to retry "
            "the whole batch with the same idempotency keys"
        )


class RequeuePartlyDone(StoreUnavailable):
    """A requeue of dead tasks on several store shards was committed on some of them only
    (each shard's part is all or none). ``requeued``: the ids requeued (READY now); the others
    were not, or their shard did not answer. Repeat the requeue with the others only: a
    requeued task is no longer DEAD and would refuse the whole request."""

    def __init__(
        self, requeued: tuple[str, ...], total: int, shards: tuple[str, ...], why: str
    ) -> None:
        self.requeued = requeued
        self.total = total
        self.shards = shards
        shown_ids = ", ".join(requeued[:4]) + (", ..." if len(requeued) > 4 else "")
        super().__init__(
            f"{len(requeued)} of {total} tasks requeued ({shown_ids}); store "
            f"{', '.join(shards)} failed ({why}): the rest were not requeued or their outcome "
            "is unknown; requeue only those not READY now"
        )


# -- the shard map and partition moves ---------------------------------------------------


class ShardMapInvalid(ChronoqError):
    """A shard map breaks its rules (a partition held twice or by no shard, a bad name or
    version): it is refused whole."""

    grpc_code = "FAILED_PRECONDITION"


class ShardMapConflict(ChronoqError):
    """The shard map changed since a move was planned: plan it again."""

    grpc_code = "FAILED_PRECONDITION"


class ShardAdminRefused(ChronoqError):
    """The shard map cannot take this change now."""

    grpc_code = "FAILED_PRECONDITION"


class MoveRecordInvalid(ChronoqError):
    """A move record in etcd does not parse: it is left alone and reported."""

    grpc_code = "FAILED_PRECONDITION"


class MoveRefused(ChronoqError):
    """The partition move cannot take this step in the shards' present state."""

    grpc_code = "FAILED_PRECONDITION"


class StaleMoveToken(MoveRefused):
    """A newer mover of these partitions holds them: this one's token is stale."""

    def __init__(self, move_id: str, token: int, current: int) -> None:
        self.move_id = move_id
        self.token = token
        self.current = current
        super().__init__(
            f"move {move_id!r}: token {token} is stale, the partitions were taken by a mover "
            f"with token {current}; this mover stops"
        )


class MoveLost(ChronoqError):
    """This node no longer holds the move's key (its lease lapsed, or another took over)."""

    grpc_code = "UNAVAILABLE"


class FreezeOverrun(StoreUnavailable):
    """The frozen last round took longer than its budget allows: the partitions are live on
    the source again (move fewer partitions per cut-over, or catch up once more first)."""


class FreezeTimedOut(StoreUnavailable):
    """Writes in flight on the shard did not finish in time: nothing was frozen."""


class ConfigError(ChronoqError):
    """A setting is invalid."""

    grpc_code = "INVALID_ARGUMENT"


class Unauthenticated(ChronoqError):
    """Missing or unknown bearer token."""

    grpc_code = "UNAUTHENTICATED"


class NamespaceDenied(ChronoqError):
    """The caller's token does not grant this namespace (or a cluster-wide call)."""

    grpc_code = "PERMISSION_DENIED"

    def __init__(self, namespace: str | None, method: str = "") -> None:
        self.namespace = namespace  # None: a cluster-wide call, which needs a "*" token
        self.method = method
        what = f"namespace {namespace!r}" if namespace is not None else "cluster-wide calls"
        super().__init__(f"token does not grant {what}" + (f" ({method})" if method else ""))


class TooManyLongPolls(ChronoqError):
    """Too many long-polling claims are open on this node: retry later."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, namespace: str, limit: int, scope: str) -> None:
        self.namespace = namespace
        self.limit = limit
        self.scope = scope  # "namespace" or "node": which cap was reached
        where = f"namespace {namespace!r} has" if scope == "namespace" else "this node has"
        super().__init__(
            f"{where} {limit} long-polling claims open, the limit: retry later, "
            "claim without waiting, or spread workers over more nodes"
        )


class TooManyBulkCalls(ChronoqError):
    """A namespace has as many bulk operations running on this node as it may: retry later."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, namespace: str, limit: int) -> None:
        self.namespace = namespace
        self.limit = limit
        super().__init__(
            f"namespace {namespace!r} has {limit} bulk operations running on this node, the "
            "limit: wait for one to answer, then retry"
        )


class StreamStalled(ChronoqError):
    """A worker stream's worker took none of its messages within the write deadline: the stream
    is closed and the tasks it had not delivered are given back."""

    grpc_code = "DEADLINE_EXCEEDED"

    def __init__(self, seconds: float, given_back: int) -> None:
        self.seconds = seconds
        self.given_back = given_back
        super().__init__(
            f"the worker read nothing of this stream for {seconds:g} s: closed, "
            f"{given_back} undelivered task(s) given back (read the stream, or open it with "
            "fewer credits)"
        )


class StreamNotOpened(ChronoqError):
    """A worker stream sent no opening message within its deadline."""

    grpc_code = "DEADLINE_EXCEEDED"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(
            f"a Work stream must send its open message within {seconds:g} s of its start"
        )


class TooManyOpenings(ChronoqError):
    """Too many worker streams on this node have not sent their opening message yet."""

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, limit: int, scope: str = "node") -> None:
        self.limit = limit
        self.scope = scope  # "node" or "caller": which cap was reached
        who = "this node has" if scope == "node" else "this caller has"
        super().__init__(
            f"{who} {limit} streams that have not sent their open message yet, the "
            "limit: retry later, and open a stream by its first message at once"
        )


class RemoteError(ChronoqError):
    """A chronoq node refused or could not serve a request (client side)."""

    grpc_codes: ClassVar[tuple[str, ...]] = ()
    """The names of the gRPC status codes a client raises this class for; the first is the
    default ``code`` of an instance made without one."""
    code: str = "UNKNOWN"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.grpc_codes:
            if _REMOTE_ERROR_OF.setdefault(name, cls) is not cls:
                raise TypeError(f"{name} is declared by {_REMOTE_ERROR_OF[name].__name__} already")
        if cls.grpc_codes:
            cls.code = cls.grpc_codes[0]

    def __init__(self, message: str, code: str | None = None) -> None:
        if code is not None:
            self.code = code
        super().__init__(message)


_REMOTE_ERROR_OF: dict[str, type[RemoteError]] = {}


def remote_error_class(code: str) -> type[RemoteError]:
    """The ``RemoteError`` subclass a client raises for the gRPC status code named ``code``."""
    return _REMOTE_ERROR_OF.get(code, RemoteError)


class BadRequest(RemoteError):
    """The node found the request invalid (INVALID_ARGUMENT): fix the named field."""

    grpc_codes = ("INVALID_ARGUMENT", "OUT_OF_RANGE")


class NotFound(RemoteError):
    """The node knows no such task (NOT_FOUND)."""

    grpc_codes = ("NOT_FOUND",)


class PreconditionFailed(RemoteError):
    """The task is not in a state for this (FAILED_PRECONDITION), e.g. a stale lease token."""

    grpc_codes = ("FAILED_PRECONDITION", "ALREADY_EXISTS")


class ResourceExhausted(RemoteError):
    """A quota or rate limit refused the request (RESOURCE_EXHAUSTED)."""

    grpc_codes = ("RESOURCE_EXHAUSTED",)


class AccessDenied(RemoteError):
    """Missing or wrong credentials (UNAUTHENTICATED or PERMISSION_DENIED)."""

    grpc_codes = ("UNAUTHENTICATED", "PERMISSION_DENIED")


class Unavailable(RemoteError):
    """The node could not be reached or did not answer in time (UNAVAILABLE, DEADLINE_EXCEEDED)."""

    grpc_codes = ("UNAVAILABLE", "DEADLINE_EXCEEDED")
