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
    __slots__ = ("namespace", "queue", "run_at", "delay", "payload", "idempotency_key", "retry", "lease_timeout", "priority", "misfire_policy", "misfire_grace", "content_type", "trace_context", "concurrency_key", "unique_key", "unique_for", "debounce_key", "debounce", "debounce_max", "labels")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
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
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_KEY_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_FOR_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_KEY_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_MAX_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
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
    concurrency_key: str
    unique_key: str
    unique_for: _duration_pb2.Duration
    debounce_key: str
    debounce: _duration_pb2.Duration
    debounce_max: _duration_pb2.Duration
    labels: _containers.ScalarMap[str, str]
    def __init__(self, namespace: _Optional[str] = ..., queue: _Optional[str] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., payload: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., lease_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[int] = ..., misfire_policy: _Optional[_Union[MisfirePolicy, str]] = ..., misfire_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., content_type: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., concurrency_key: _Optional[str] = ..., unique_key: _Optional[str] = ..., unique_for: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., debounce_key: _Optional[str] = ..., debounce: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., debounce_max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "namespace", "queue", "state", "run_at", "payload", "idempotency_key", "attempt", "max_attempts", "priority", "misfire_policy", "misfire_grace", "lease_timeout", "backoff_initial", "backoff_max", "partition", "bucket", "last_error", "worker_id", "created_at", "fired_at", "lease_until", "finished_at", "content_type", "trace_context", "concurrency_key", "unique_key", "unique_until", "debounce_key", "debounce_until", "labels")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
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
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_KEY_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_KEY_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
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
    concurrency_key: str
    unique_key: str
    unique_until: _timestamp_pb2.Timestamp
    debounce_key: str
    debounce_until: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., namespace: _Optional[str] = ..., queue: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., payload: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., priority: _Optional[int] = ..., misfire_policy: _Optional[_Union[MisfirePolicy, str]] = ..., misfire_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_initial: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., partition: _Optional[int] = ..., bucket: _Optional[int] = ..., last_error: _Optional[str] = ..., worker_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., content_type: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., concurrency_key: _Optional[str] = ..., unique_key: _Optional[str] = ..., unique_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., debounce_key: _Optional[str] = ..., debounce_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

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
    __slots__ = ("tasks", "ids_only", "shared", "count", "run_at_us", "payloads", "idempotency_keys")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    IDS_ONLY_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_US_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEYS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSpec]
    ids_only: bool
    shared: TaskSpec
    count: int
    run_at_us: _containers.RepeatedScalarFieldContainer[int]
    payloads: _containers.RepeatedScalarFieldContainer[bytes]
    idempotency_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskSpec, _Mapping]]] = ..., ids_only: _Optional[bool] = ..., shared: _Optional[_Union[TaskSpec, _Mapping]] = ..., count: _Optional[int] = ..., run_at_us: _Optional[_Iterable[int]] = ..., payloads: _Optional[_Iterable[bytes]] = ..., idempotency_keys: _Optional[_Iterable[str]] = ...) -> None: ...

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
    __slots__ = ("namespace", "queue", "state", "page_size", "page_token", "labels", "run_at_from", "run_at_to")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FROM_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_TO_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queue: str
    state: TaskState
    page_size: int
    page_token: str
    labels: _containers.ScalarMap[str, str]
    run_at_from: _timestamp_pb2.Timestamp
    run_at_to: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., queue: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., run_at_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run_at_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

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

class TaskFilter(_message.Message):
    __slots__ = ("queue", "labels", "state", "run_at_from", "run_at_to")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FROM_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_TO_FIELD_NUMBER: _ClassVar[int]
    queue: str
    labels: _containers.ScalarMap[str, str]
    state: TaskState
    run_at_from: _timestamp_pb2.Timestamp
    run_at_to: _timestamp_pb2.Timestamp
    def __init__(self, queue: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., state: _Optional[_Union[TaskState, str]] = ..., run_at_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run_at_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BulkRequest(_message.Message):
    __slots__ = ("namespace", "filter", "dry_run", "max_tasks", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    filter: TaskFilter
    dry_run: bool
    max_tasks: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., filter: _Optional[_Union[TaskFilter, _Mapping]] = ..., dry_run: _Optional[bool] = ..., max_tasks: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class BulkResponse(_message.Message):
    __slots__ = ("count", "more", "next_page_token", "dry_run")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    count: int
    more: bool
    next_page_token: str
    dry_run: bool
    def __init__(self, count: _Optional[int] = ..., more: _Optional[bool] = ..., next_page_token: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class QueueCountsRequest(_message.Message):
    __slots__ = ("namespace", "queues", "label_key")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    LABEL_KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    label_key: str
    def __init__(self, namespace: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., label_key: _Optional[str] = ...) -> None: ...

class StateTally(_message.Message):
    __slots__ = ("scheduled", "ready", "running", "dead")
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    scheduled: int
    ready: int
    running: int
    dead: int
    def __init__(self, scheduled: _Optional[int] = ..., ready: _Optional[int] = ..., running: _Optional[int] = ..., dead: _Optional[int] = ...) -> None: ...

class QueueTally(_message.Message):
    __slots__ = ("queue", "counts", "oldest_ready_at", "oldest_ready_age")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_READY_AT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_READY_AGE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    counts: StateTally
    oldest_ready_at: _timestamp_pb2.Timestamp
    oldest_ready_age: _duration_pb2.Duration
    def __init__(self, queue: _Optional[str] = ..., counts: _Optional[_Union[StateTally, _Mapping]] = ..., oldest_ready_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., oldest_ready_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class LabelTally(_message.Message):
    __slots__ = ("queue", "value", "counts")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    value: str
    counts: StateTally
    def __init__(self, queue: _Optional[str] = ..., value: _Optional[str] = ..., counts: _Optional[_Union[StateTally, _Mapping]] = ...) -> None: ...

class QueueCountsResponse(_message.Message):
    __slots__ = ("queues", "other", "totals", "truncated", "as_of", "now", "uncounted_partitions", "labels", "labels_capped", "ready_as_of")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    OTHER_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    UNCOUNTED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LABELS_CAPPED_FIELD_NUMBER: _ClassVar[int]
    READY_AS_OF_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueTally]
    other: StateTally
    totals: StateTally
    truncated: bool
    as_of: _timestamp_pb2.Timestamp
    now: _timestamp_pb2.Timestamp
    uncounted_partitions: int
    labels: _containers.RepeatedCompositeFieldContainer[LabelTally]
    labels_capped: bool
    ready_as_of: _timestamp_pb2.Timestamp
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueTally, _Mapping]]] = ..., other: _Optional[_Union[StateTally, _Mapping]] = ..., totals: _Optional[_Union[StateTally, _Mapping]] = ..., truncated: _Optional[bool] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., now: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., uncounted_partitions: _Optional[int] = ..., labels: _Optional[_Iterable[_Union[LabelTally, _Mapping]]] = ..., labels_capped: _Optional[bool] = ..., ready_as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class QueueSettings(_message.Message):
    __slots__ = ("namespace", "queue", "paused", "paused_at", "max_running_per_key", "max_starts_per_key", "updated_at")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_PER_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_STARTS_PER_KEY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queue: str
    paused: bool
    paused_at: _timestamp_pb2.Timestamp
    max_running_per_key: int
    max_starts_per_key: float
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., queue: _Optional[str] = ..., paused: _Optional[bool] = ..., paused_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_running_per_key: _Optional[int] = ..., max_starts_per_key: _Optional[float] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SetQueueRequest(_message.Message):
    __slots__ = ("namespace", "queue", "max_running_per_key", "max_starts_per_key")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_PER_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_STARTS_PER_KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queue: str
    max_running_per_key: int
    max_starts_per_key: float
    def __init__(self, namespace: _Optional[str] = ..., queue: _Optional[str] = ..., max_running_per_key: _Optional[int] = ..., max_starts_per_key: _Optional[float] = ...) -> None: ...

class QueueRef(_message.Message):
    __slots__ = ("namespace", "queue")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    queue: str
    def __init__(self, namespace: _Optional[str] = ..., queue: _Optional[str] = ...) -> None: ...

class ResumeQueueResponse(_message.Message):
    __slots__ = ("queue", "skipped")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    queue: QueueSettings
    skipped: int
    def __init__(self, queue: _Optional[_Union[QueueSettings, _Mapping]] = ..., skipped: _Optional[int] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueSettings]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueSettings, _Mapping]]] = ...) -> None: ...
