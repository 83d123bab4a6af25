import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_SCHEDULED: _ClassVar[TaskState]
    TASK_STATE_READY: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_SUCCEEDED: _ClassVar[TaskState]
    TASK_STATE_DEAD: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]
    TASK_STATE_SKIPPED: _ClassVar[TaskState]

class MisfirePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MISFIRE_POLICY_UNSPECIFIED: _ClassVar[MisfirePolicy]
    MISFIRE_POLICY_FIRE_LATE: _ClassVar[MisfirePolicy]
    MISFIRE_POLICY_SKIP: _ClassVar[MisfirePolicy]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_SCHEDULED: TaskState
TASK_STATE_READY: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_SUCCEEDED: TaskState
TASK_STATE_DEAD: TaskState
TASK_STATE_CANCELLED: TaskState
TASK_STATE_SKIPPED: TaskState
MISFIRE_POLICY_UNSPECIFIED: MisfirePolicy
MISFIRE_POLICY_FIRE_LATE: MisfirePolicy
MISFIRE_POLICY_SKIP: MisfirePolicy

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "backoff_initial", "backoff_max")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_INITIAL_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    backoff_initial: _duration_pb2.Duration
    backoff_max: _duration_pb2.Duration
    def __init__(self, max_attempts: _Optional[int] = ..., backoff_initial: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("namespace", "queue", "run_at", "delay", "payload", "idempotency_key", "retry", "lease_timeout", "priority", "misfire_policy", "misfire_grace", "content_type", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_POLICY_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_GRACE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queue: str
    run_at: _timestamp_pb2.Timestamp
    delay: _duration_pb2.Duration
    payload: bytes
    idempotency_key: str
    retry: RetryPolicy
    lease_timeout: _duration_pb2.Duration
    priority: int
    misfire_policy: MisfirePolicy
    misfire_grace: _duration_pb2.Duration
    content_type: str
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, namespace: _Optional[str] = ..., queue: _Optional[str] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., payload: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., lease_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[int] = ..., misfire_policy: _Optional[_Union[MisfirePolicy, str]] = ..., misfire_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., content_type: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "namespace", "queue", "state", "run_at", "payload", "idempotency_key", "attempt", "max_attempts", "priority", "misfire_policy", "misfire_grace", "lease_timeout", "backoff_initial", "backoff_max", "partition", "bucket", "last_error", "worker_id", "created_at", "fired_at", "lease_until", "finished_at", "content_type", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_POLICY_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_GRACE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_INITIAL_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FIRED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    queue: str
    state: TaskState
    run_at: _timestamp_pb2.Timestamp
    payload: bytes
    idempotency_key: str
    attempt: int
    max_attempts: int
    priority: int
    misfire_policy: MisfirePolicy
    misfire_grace: _duration_pb2.Duration
    lease_timeout: _duration_pb2.Duration
    backoff_initial: _duration_pb2.Duration
    backoff_max: _duration_pb2.Duration
    partition: int
    bucket: int
    last_error: str
    worker_id: str
    created_at: _timestamp_pb2.Timestamp
    fired_at: _timestamp_pb2.Timestamp
    lease_until: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    content_type: str
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., namespace: _Optional[str] = ..., queue: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., payload: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., priority: _Optional[int] = ..., misfire_policy: _Optional[_Union[MisfirePolicy, str]] = ..., misfire_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_initial: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., partition: _Optional[int] = ..., bucket: _Optional[int] = ..., last_error: _Optional[str] = ..., worker_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., content_type: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskSpec
    def __init__(self, task: _Optional[_Union[TaskSpec, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("task", "created")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task: Task
    created: bool
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("tasks", "ids_only")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    IDS_ONLY_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSpec]
    ids_only: bool
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskSpec, _Mapping]]] = ..., ids_only: _Optional[bool] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("tasks", "created", "ids")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    created: _containers.RepeatedScalarFieldContainer[bool]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., created: _Optional[_Iterable[bool]] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("namespace", "id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("namespace", "id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("namespace", "queue", "state", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queue: str
    state: TaskState
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., queue: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RequeueRequest(_message.Message):
    __slots__ = ("namespace", "ids")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RequeueResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class QueueLimit(_message.Message):
    __slots__ = ("namespace", "queue", "rate", "burst")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queue: str
    rate: float
    burst: float
    def __init__(self, namespace: _Optional[str] = ..., queue: _Optional[str] = ..., rate: _Optional[float] = ..., burst: _Optional[float] = ...) -> None: ...

class CountTasksRequest(_message.Message):
    __slots__ = ("namespace", "states")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    states: _containers.RepeatedScalarFieldContainer[TaskState]
    def __init__(self, namespace: _Optional[str] = ..., states: _Optional[_Iterable[_Union[TaskState, str]]] = ...) -> None: ...

class QueueStateCount(_message.Message):
    __slots__ = ("queue", "state", "count", "oldest_run_at")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_RUN_AT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    state: TaskState
    count: int
    oldest_run_at: _timestamp_pb2.Timestamp
    def __init__(self, queue: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., count: _Optional[int] = ..., oldest_run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CountTasksResponse(_message.Message):
    __slots__ = ("counts", "capped", "truncated")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    CAPPED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedCompositeFieldContainer[QueueStateCount]
    capped: _containers.RepeatedScalarFieldContainer[TaskState]
    truncated: _containers.RepeatedScalarFieldContainer[TaskState]
    def __init__(self, counts: _Optional[_Iterable[_Union[QueueStateCount, _Mapping]]] = ..., capped: _Optional[_Iterable[_Union[TaskState, str]]] = ..., truncated: _Optional[_Iterable[_Union[TaskState, str]]] = ...) -> None: ...

class ListQueueLimitsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ListQueueLimitsResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[QueueLimit]
    def __init__(self, limits: _Optional[_Iterable[_Union[QueueLimit, _Mapping]]] = ...) -> None: ...
