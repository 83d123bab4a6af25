import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from chronoq.api.v1 import tasks_pb2 as _tasks_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClaimRequest(_message.Message):
    __slots__ = ("namespace", "queues", "worker_id", "max_tasks", "wait")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    worker_id: str
    max_tasks: int
    wait: _duration_pb2.Duration
    def __init__(self, namespace: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., worker_id: _Optional[str] = ..., max_tasks: _Optional[int] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_tasks_pb2.Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[_tasks_pb2.Task, _Mapping]]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("task_id", "lease_token")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    lease_token: int
    def __init__(self, task_id: _Optional[str] = ..., lease_token: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("namespace", "leases")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, namespace: _Optional[str] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class HeartbeatResult(_message.Message):
    __slots__ = ("task_id", "ok", "cancelled", "error")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    ok: bool
    cancelled: bool
    error: str
    def __init__(self, task_id: _Optional[str] = ..., ok: _Optional[bool] = ..., cancelled: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[HeartbeatResult]
    def __init__(self, results: _Optional[_Iterable[_Union[HeartbeatResult, _Mapping]]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("namespace", "lease")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    lease: Lease
    def __init__(self, namespace: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class CompleteBatchRequest(_message.Message):
    __slots__ = ("namespace", "leases", "claim")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    claim: ClaimRequest
    def __init__(self, namespace: _Optional[str] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., claim: _Optional[_Union[ClaimRequest, _Mapping]] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("task_id", "ok", "error")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    ok: bool
    error: str
    def __init__(self, task_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class CompleteBatchResponse(_message.Message):
    __slots__ = ("results", "claimed")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    claimed: _containers.RepeatedCompositeFieldContainer[_tasks_pb2.Task]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ..., claimed: _Optional[_Iterable[_Union[_tasks_pb2.Task, _Mapping]]] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("namespace", "lease", "error", "fatal", "retry_after")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    lease: Lease
    error: str
    fatal: bool
    retry_after: _duration_pb2.Duration
    def __init__(self, namespace: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., error: _Optional[str] = ..., fatal: _Optional[bool] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("namespace", "lease")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    lease: Lease
    def __init__(self, namespace: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class WorkOpen(_message.Message):
    __slots__ = ("namespace", "queues", "worker_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    worker_id: str
    def __init__(self, namespace: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., worker_id: _Optional[str] = ...) -> None: ...

class WorkRequest(_message.Message):
    __slots__ = ("open", "credits", "complete", "ack_seq")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ACK_SEQ_FIELD_NUMBER: _ClassVar[int]
    open: WorkOpen
    credits: int
    complete: _containers.RepeatedCompositeFieldContainer[Lease]
    ack_seq: int
    def __init__(self, open: _Optional[_Union[WorkOpen, _Mapping]] = ..., credits: _Optional[int] = ..., complete: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., ack_seq: _Optional[int] = ...) -> None: ...

class WorkResponse(_message.Message):
    __slots__ = ("tasks", "ack_seq", "acked")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    ACK_SEQ_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_tasks_pb2.Task]
    ack_seq: int
    acked: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, tasks: _Optional[_Iterable[_Union[_tasks_pb2.Task, _Mapping]]] = ..., ack_seq: _Optional[int] = ..., acked: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...
