"""QueueCounts answers, pb <-> ``chronoq.queuecounts.QueueSnapshot``."""

from __future__ import annotations

from datetime import datetime, timedelta

from google.protobuf import timestamp_pb2

from chronoq.api.convert import from_timestamp, to_duration, to_timestamp
from chronoq.api.v1 import tasks_pb2
from chronoq.queuecounts import LabelTally, QueueSnapshot, QueueTally, StateCounts


def _ts(when: datetime) -> timestamp_pb2.Timestamp:
    ts = to_timestamp(when)
    assert ts is not None
    return ts


def _tally_to_pb(c: StateCounts) -> tasks_pb2.StateTally:
    return tasks_pb2.StateTally(
        scheduled=c.scheduled, ready=c.ready, running=c.running, dead=c.dead
    )


def _tally_from_pb(pb: tasks_pb2.StateTally) -> StateCounts:
    return StateCounts(pb.scheduled, pb.ready, pb.running, pb.dead)


def snapshot_to_pb(s: QueueSnapshot) -> tasks_pb2.QueueCountsResponse:
    queues = []
    for t in s.queues:
        pb = tasks_pb2.QueueTally(queue=t.queue, counts=_tally_to_pb(t.counts))
        if t.oldest_ready_at is not None:
            pb.oldest_ready_at.CopyFrom(_ts(t.oldest_ready_at))
            pb.oldest_ready_age.CopyFrom(to_duration(max(timedelta(0), s.now - t.oldest_ready_at)))
        queues.append(pb)
    out = tasks_pb2.QueueCountsResponse(
        queues=queues,
        other=_tally_to_pb(s.other),
        totals=_tally_to_pb(s.totals),
        truncated=s.truncated,
        now=_ts(s.now),
        uncounted_partitions=s.uncounted_partitions,
        labels=[
            tasks_pb2.LabelTally(queue=x.queue, value=x.value, counts=_tally_to_pb(x.counts))
            for x in s.labels
        ],
        labels_capped=s.labels_capped,
    )
    if s.as_of is not None:
        out.as_of.CopyFrom(_ts(s.as_of))
    if s.ready_as_of is not None:
        out.ready_as_of.CopyFrom(_ts(s.ready_as_of))
    return out


def snapshot_from_pb(pb: tasks_pb2.QueueCountsResponse) -> QueueSnapshot:
    return QueueSnapshot(
        queues=tuple(
            QueueTally(
                t.queue,
                _tally_from_pb(t.counts),
                from_timestamp("oldest_ready_at", t.oldest_ready_at)
                if t.HasField("oldest_ready_at")
                else None,
            )
            for t in pb.queues
        ),
        other=_tally_from_pb(pb.other),
        totals=_tally_from_pb(pb.totals),
        truncated=pb.truncated,
        as_of=from_timestamp("as_of", pb.as_of) if pb.HasField("as_of") else None,
        now=from_timestamp("now", pb.now),
        uncounted_partitions=pb.uncounted_partitions,
        labels=tuple(LabelTally(x.queue, x.value, _tally_from_pb(x.counts)) for x in pb.labels),
        labels_capped=pb.labels_capped,
        ready_as_of=from_timestamp("ready_as_of", pb.ready_as_of)
        if pb.HasField("ready_as_of")
        else None,
    )
