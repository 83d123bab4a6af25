"""The trace context a task carries from its submitter to its worker: W3C Trace Context
headers (``traceparent``, ``tracestate``) as a small string map, bounded at the edge, kept
as JSON in one column.

Pure: no OpenTelemetry here (``chronoq.tracing`` is the adapter). A task without a context
carries the empty tuple, which the store keeps as NULL, so untraced tasks cost nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from chronoq.errors import InvalidArgument

#: A trace context: (key, value) pairs sorted by key; hashable, like the rest of a Task.
Carrier = tuple[tuple[str, str], ...]

#: Entries a task may carry: traceparent, tracestate, and room for a propagator or two more.
MAX_ENTRIES = 8
#: A key is a lowercase header name.
MAX_KEY_CHARS = 64
#: W3C caps tracestate at 32 members of up to 256 characters; real ones are far shorter.
MAX_VALUE_CHARS = 512

_KEY = re.compile(r"[a-z0-9][a-z0-9_.*/-]*")
_VALUE = re.compile(r"[\x20-\x7e]*")  # printable ASCII: what HTTP header values carry

FIELD = "trace_context"


def check_carrier(entries: Mapping[str, str], field: str = FIELD) -> Carrier:
    """A client's trace context as a ``Carrier``; ``InvalidArgument`` when it is not one."""
    if not entries:
        return ()
    if len(entries) > MAX_ENTRIES:
        raise InvalidArgument(field, f"holds {len(entries)} entries; the limit is {MAX_ENTRIES}")
    for key, value in entries.items():
        if len(key) > MAX_KEY_CHARS or not _KEY.fullmatch(key):
            raise InvalidArgument(
                field,
                f"key {key[:MAX_KEY_CHARS]!r} must be a lowercase header name of at most "
                f"{MAX_KEY_CHARS} characters",
            )
        if len(value) > MAX_VALUE_CHARS or not _VALUE.fullmatch(value):
            raise InvalidArgument(
                field,
                f"value of {key!r} must be printable ASCII of at most {MAX_VALUE_CHARS} characters",
            )
    return tuple(sorted(entries.items()))


def to_json(carrier: Carrier) -> str | None:
    """The stored form: a JSON object, or None (SQL NULL) for no context."""
    if not carrier:
        return None
    return json.dumps(dict(carrier), separators=(",", ":"), sort_keys=True)


def stored_bytes(carrier: Carrier) -> int:
    """What PostgreSQL's ``pg_column_size`` reads of the stored form (a ``jsonb`` object of
    strings, 0 for NULL): the varlena header (1 byte up to 127 bytes, else 4), the container
    header (4), two 4-byte entries per pair, then the keys' and values' bytes, unpadded.
    A value large enough to be compressed in the row reads smaller than this."""
    if not carrier:
        return 0
    size = 4 + sum(8 + len(k.encode()) + len(v.encode()) for k, v in carrier)
    return size + (1 if size < 127 else 4)


def from_json(stored: str | None) -> Carrier:
    """The stored form read back; anything that is not a JSON object of strings reads as no
    context (a bad value must never fail a claim or a page)."""
    if not stored:
        return ()
    try:
        value = json.loads(stored)
    except ValueError:
        return ()
    if not isinstance(value, dict):
        return ()
    return tuple(sorted((k, v) for k, v in value.items() if isinstance(v, str)))
