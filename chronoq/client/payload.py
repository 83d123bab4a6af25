"""Task payloads: raw bytes as they are, any other value as JSON, with its content type.

Pure. A payload travels with a MIME type (``Task.content_type``) so that a handler, in any
language, knows what it got: ``application/octet-stream`` for bytes (the default, what older
clients send), ``application/json`` for a value encoded here. Encoding is strict so that what
a handler decodes equals what was submitted: string keys only (``json`` would turn ``1`` into
``"1"``), finite numbers, bounded nesting; anything else is refused before a call is made,
naming where in the value it sits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from chronoq.errors import PayloadNotJSON
from chronoq.limits import check_content_type
from chronoq.models import APPLICATION_JSON, OCTET_STREAM

#: Nesting depth of a JSON payload at most: deeper values are refused before encoding, and a
#: deeper document fails to decode with a clear error instead of a ``RecursionError``.
MAX_JSON_DEPTH = 64

#: What ``encode`` accepts besides bytes, for the signatures of the SDK.
Payload = Any

_SCALARS = (str, int, float, bool, type(None))


def encode(value: Payload, content_type: str | None = None) -> tuple[bytes, str]:
    """``value`` as payload bytes and their content type.

    Bytes (or a bytearray/memoryview) pass unchanged, as ``content_type`` (default
    ``application/octet-stream``); any other value is encoded as JSON (UTF-8), whose content
    type is ``application/json`` (a ``content_type`` naming another type is refused).

    Raises:
        PayloadNotJSON: the value holds something JSON cannot represent faithfully.
        InvalidArgument: ``content_type`` is not a MIME type.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), check_content_type(content_type) if content_type else OCTET_STREAM
    if content_type is not None and not is_json(content_type):
        raise PayloadNotJSON(
            "payload",
            f"a {type(value).__name__} is sent as JSON; content_type {content_type!r} "
            "needs bytes (encode the value yourself)",
        )
    _check_json(value, "payload", 0)
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode(), content_type or APPLICATION_JSON


def decode(payload: bytes, content_type: str) -> Payload:
    """What a handler reads: the decoded value of a JSON payload, else the bytes as they are.

    Raises:
        PayloadNotJSON: a JSON content type over bytes that are not JSON.
    """
    if not is_json(content_type):
        return payload
    try:
        return json.loads(payload)
    except RecursionError:
        raise PayloadNotJSON(
            "payload", f"JSON nested deeper than Python can decode ({len(payload)} bytes)"
        ) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise PayloadNotJSON("payload", f"marked {content_type} but is not JSON: {exc}") from None


def is_json(content_type: str) -> bool:
    """``application/json``, with parameters or a ``+json`` suffix (``application/vnd.x+json``)."""
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == APPLICATION_JSON or (mime.startswith("application/") and mime.endswith("+json"))


def _check_json(value: object, path: str, depth: int) -> None:
    """Refuse what ``json.dumps`` would refuse, alter or recurse into without end."""
    if depth > MAX_JSON_DEPTH:
        raise PayloadNotJSON(path, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise PayloadNotJSON(path, f"{value!r} is not a JSON number")
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadNotJSON(
                    path, f"key {key!r} is of type {type(key).__name__}; JSON keys are strings"
                )
            _check_json(item, f"{path}[{key!r}]", depth + 1)
        return
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]", depth + 1)
        return
    raise PayloadNotJSON(
        path,
        f"type {type(value).__name__} is not JSON (use str, int, float, bool, None, "
        "list or dict, or submit bytes)",
    )
