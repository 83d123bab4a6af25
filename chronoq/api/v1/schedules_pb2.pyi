import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from chronoq.api.v1 import tasks_pb2 as _tasks_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CatchUp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CATCH_UP_UNSPECIFIED: _ClassVar[CatchUp]
    CATCH_UP_ALL: _ClassVar[CatchUp]
    CATCH_UP_LATEST: _ClassVar[CatchUp]
    CATCH_UP_NONE: _ClassVar[CatchUp]
CATCH_UP_UNSPECIFIED: CatchUp
CATCH_UP_ALL: CatchUp
CATCH_UP_LATEST: CatchUp
CATCH_UP_NONE: CatchUp

class ScheduleSpec(_message.Message):
    __slots__ = ("namespace", "name", "queue", "cron", "interval", "timezone", "start_at", "catch_up", "payload", "retry", "lease_timeout", "priority")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    queue: str
    cron: str
    interval: _duration_pb2.Duration
    timezone: str
    start_at: _timestamp_pb2.Timestamp
    catch_up: CatchUp
    payload: bytes
    retry: _tasks_pb2.RetryPolicy
    lease_timeout: _duration_pb2.Duration
    priority: int
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., queue: _Optional[str] = ..., cron: _Optional[str] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timezone: _Optional[str] = ..., start_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., catch_up: _Optional[_Union[CatchUp, str]] = ..., payload: _Optional[bytes] = ..., retry: _Optional[_Union[_tasks_pb2.RetryPolicy, _Mapping]] = ..., lease_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[int] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("id", "spec", "paused", "next_fire_at", "last_fire_at", "created_total", "skipped_total", "partition", "paused_reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: ScheduleSpec
    paused: bool
    next_fire_at: _timestamp_pb2.Timestamp
    last_fire_at: _timestamp_pb2.Timestamp
    created_total: int
    skipped_total: int
    partition: int
    paused_reason: str
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[ScheduleSpec, _Mapping]] = ..., paused: _Optional[bool] = ..., next_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_total: _Optional[int] = ..., skipped_total: _Optional[int] = ..., partition: _Optional[int] = ..., paused_reason: _Optional[str] = ...) -> None: ...

class ScheduleRef(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("namespace", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "next_page_token")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    next_page_token: str
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
