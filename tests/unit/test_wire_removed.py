"""Fields removed from the wire contract keep their numbers and names reserved.

A number given again to another field would make an old peer's bytes mean something else; a
reserved one cannot be reused (protoc refuses it), and an old peer's message that still
carries the field parses as an unknown field, not as an error.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2

from chronoq.api.v1 import cluster_pb2

#: (message, number, name) of every removed field.
REMOVED = [(cluster_pb2.StatusResponse, 9, "tasks_by_state")]


def _proto(message: type) -> descriptor_pb2.DescriptorProto:
    out = descriptor_pb2.DescriptorProto()
    message.DESCRIPTOR.CopyToProto(out)  # type: ignore[attr-defined]
    return out


def test_removed_fields_are_reserved_by_number_and_name() -> None:
    for message, number, name in REMOVED:
        proto = _proto(message)
        assert name not in message.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
        assert any(r.start <= number < r.end for r in proto.reserved_range), (name, number)
        assert name in proto.reserved_name


def test_an_old_status_answer_still_parses() -> None:
    """An old node's StatusResponse with a tasks_by_state entry: the field is skipped."""
    current = cluster_pb2.StatusResponse(cluster="c", node_id="n").SerializeToString()
    # A map<string, uint64> entry {key: "READY", value: 3} as field 9 (tag 9 << 3 | 2).
    item = b"\x0a\x05READY\x10\x03"
    old = current + bytes([9 << 3 | 2, len(item)]) + item
    parsed = cluster_pb2.StatusResponse.FromString(old)
    assert (parsed.cluster, parsed.node_id) == ("c", "n")
