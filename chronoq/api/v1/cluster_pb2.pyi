import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ("bucket_horizon",)
    BUCKET_HORIZON_FIELD_NUMBER: _ClassVar[int]
    bucket_horizon: int
    def __init__(self, bucket_horizon: _Optional[int] = ...) -> None: ...

class PartitionOwnership(_message.Message):
    __slots__ = ("partition", "owner", "fencing_token", "watermark_bucket", "shard")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_BUCKET_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    partition: int
    owner: str
    fencing_token: int
    watermark_bucket: int
    shard: str
    def __init__(self, partition: _Optional[int] = ..., owner: _Optional[str] = ..., fencing_token: _Optional[int] = ..., watermark_bucket: _Optional[int] = ..., shard: _Optional[str] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("node_id", "address", "owned_partitions", "lateness_p50_ms", "lateness_p99_ms", "fired_total")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OWNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LATENESS_P50_MS_FIELD_NUMBER: _ClassVar[int]
    LATENESS_P99_MS_FIELD_NUMBER: _ClassVar[int]
    FIRED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    owned_partitions: int
    lateness_p50_ms: float
    lateness_p99_ms: float
    fired_total: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., owned_partitions: _Optional[int] = ..., lateness_p50_ms: _Optional[float] = ..., lateness_p99_ms: _Optional[float] = ..., fired_total: _Optional[int] = ...) -> None: ...

class BucketCount(_message.Message):
    __slots__ = ("bucket", "starts_at", "pending")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    STARTS_AT_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    bucket: int
    starts_at: _timestamp_pb2.Timestamp
    pending: int
    def __init__(self, bucket: _Optional[int] = ..., starts_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pending: _Optional[int] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("name", "dsn", "health", "partitions", "partition_count", "pending")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DSN_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    name: str
    dsn: str
    health: str
    partitions: str
    partition_count: int
    pending: int
    def __init__(self, name: _Optional[str] = ..., dsn: _Optional[str] = ..., health: _Optional[str] = ..., partitions: _Optional[str] = ..., partition_count: _Optional[int] = ..., pending: _Optional[int] = ...) -> None: ...

class ShardMapStatus(_message.Message):
    __slots__ = ("version", "shards", "moves_in_progress", "error", "moves", "moves_error")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    MOVES_IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    MOVES_ERROR_FIELD_NUMBER: _ClassVar[int]
    version: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    moves_in_progress: int
    error: str
    moves: _containers.RepeatedCompositeFieldContainer[MoveStatus]
    moves_error: str
    def __init__(self, version: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., moves_in_progress: _Optional[int] = ..., error: _Optional[str] = ..., moves: _Optional[_Iterable[_Union[MoveStatus, _Mapping]]] = ..., moves_error: _Optional[str] = ...) -> None: ...

class MoveStatus(_message.Message):
    __slots__ = ("id", "partitions", "source", "target", "phase", "rows_copied", "rounds", "next_version", "driver", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ROWS_COPIED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    partitions: str
    source: str
    target: str
    phase: str
    rows_copied: int
    rounds: int
    next_version: int
    driver: str
    error: str
    def __init__(self, id: _Optional[str] = ..., partitions: _Optional[str] = ..., source: _Optional[str] = ..., target: _Optional[str] = ..., phase: _Optional[str] = ..., rows_copied: _Optional[int] = ..., rounds: _Optional[int] = ..., next_version: _Optional[int] = ..., driver: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("cluster", "node_id", "now", "partitions", "bucket_seconds", "members", "ownership", "buckets", "firing_partitions", "shard_map")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    OWNERSHIP_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    FIRING_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SHARD_MAP_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    node_id: str
    now: _timestamp_pb2.Timestamp
    partitions: int
    bucket_seconds: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    ownership: _containers.RepeatedCompositeFieldContainer[PartitionOwnership]
    buckets: _containers.RepeatedCompositeFieldContainer[BucketCount]
    firing_partitions: _containers.RepeatedScalarFieldContainer[int]
    shard_map: ShardMapStatus
    def __init__(self, cluster: _Optional[str] = ..., node_id: _Optional[str] = ..., now: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., partitions: _Optional[int] = ..., bucket_seconds: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., ownership: _Optional[_Iterable[_Union[PartitionOwnership, _Mapping]]] = ..., buckets: _Optional[_Iterable[_Union[BucketCount, _Mapping]]] = ..., firing_partitions: _Optional[_Iterable[int]] = ..., shard_map: _Optional[_Union[ShardMapStatus, _Mapping]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("node_id", "released")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    released: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., released: _Optional[_Iterable[int]] = ...) -> None: ...

class AddShardRequest(_message.Message):
    __slots__ = ("dsn",)
    DSN_FIELD_NUMBER: _ClassVar[int]
    dsn: str
    def __init__(self, dsn: _Optional[str] = ...) -> None: ...

class AddShardResponse(_message.Message):
    __slots__ = ("shard", "dsn", "map_version")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    DSN_FIELD_NUMBER: _ClassVar[int]
    MAP_VERSION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    dsn: str
    map_version: int
    def __init__(self, shard: _Optional[str] = ..., dsn: _Optional[str] = ..., map_version: _Optional[int] = ...) -> None: ...

class MovePartitionsRequest(_message.Message):
    __slots__ = ("partitions", "target")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    partitions: str
    target: str
    def __init__(self, partitions: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class MovePartitionsResponse(_message.Message):
    __slots__ = ("moves",)
    MOVES_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[MoveStatus]
    def __init__(self, moves: _Optional[_Iterable[_Union[MoveStatus, _Mapping]]] = ...) -> None: ...

class RebalanceRequest(_message.Message):
    __slots__ = ("dry_run",)
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    def __init__(self, dry_run: _Optional[bool] = ...) -> None: ...

class RebalanceResponse(_message.Message):
    __slots__ = ("moves",)
    MOVES_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[MoveStatus]
    def __init__(self, moves: _Optional[_Iterable[_Union[MoveStatus, _Mapping]]] = ...) -> None: ...
