"""Queue settings on the wire, pb <-> ``chronoq.queue_settings.QueueSettings``."""

from __future__ import annotations

from chronoq.api.convert import from_timestamp, to_timestamp
from chronoq.api.v1 import tasks_pb2
from chronoq.queue_settings import QueueSettings


def settings_to_pb(s: QueueSettings) -> tasks_pb2.QueueSettings:
    return tasks_pb2.QueueSettings(
        namespace=s.namespace,
        queue=s.queue,
        paused=s.paused,
        paused_at=to_timestamp(s.paused_at),
        max_running_per_key=s.max_running_per_key,
        max_starts_per_key=s.max_starts_per_key,
        updated_at=to_timestamp(s.updated_at),
    )


def settings_from_pb(pb: tasks_pb2.QueueSettings) -> QueueSettings:
    return QueueSettings(
        namespace=pb.namespace,
        queue=pb.queue,
        paused=pb.paused,
        paused_at=from_timestamp("paused_at", pb.paused_at) if pb.HasField("paused_at") else None,
        max_running_per_key=pb.max_running_per_key,
        max_starts_per_key=pb.max_starts_per_key,
        updated_at=(
            from_timestamp("updated_at", pb.updated_at) if pb.HasField("updated_at") else None
        ),
    )
