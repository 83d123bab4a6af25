"""A task's payload as a person reads it: text, pretty JSON or a hex dump, cut at a size.

Payloads are opaque bytes of up to megabytes; the page shows at most ``limit`` bytes of them
and says when it cut. Pure.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

#: Bytes of a payload shown by default; the page can ask for more, up to ``MAX_SHOWN_BYTES``.
DEFAULT_SHOWN_BYTES = 4096
MAX_SHOWN_BYTES = 256 * 1024
#: Bytes per line of a hex dump.
HEX_LINE_BYTES = 16
#: Share of control characters (other than whitespace) above which bytes do not read as text.
MAX_CONTROL_SHARE = 0.05


class PayloadView(enum.StrEnum):
    AUTO = "auto"  # JSON when it parses, text when it decodes, hex otherwise
    TEXT = "text"
    JSON = "json"
    HEX = "hex"


@dataclass(frozen=True)
class ShownPayload:
    """What the page shows: the view actually used, the text, the payload's size, whether
    the text is cut, and why a requested view could not be used (empty when it could)."""

    view: PayloadView
    text: str
    size: int
    cut: bool
    note: str = ""


def show_payload(
    data: bytes, view: PayloadView = PayloadView.AUTO, limit: int = DEFAULT_SHOWN_BYTES
) -> ShownPayload:
    """``data`` in ``view``, at most ``limit`` bytes of it (clamped to 1..MAX_SHOWN_BYTES)."""
    limit = max(1, min(limit, MAX_SHOWN_BYTES))
    head, cut = data[:limit], len(data) > limit
    if view in (PayloadView.AUTO, PayloadView.JSON):
        pretty = _pretty_json(data) if not cut else None
        if pretty is not None:
            return ShownPayload(PayloadView.JSON, pretty, len(data), False)
        if view is PayloadView.JSON:
            note = "too large to parse as a whole" if cut else "not valid JSON"
            return ShownPayload(PayloadView.TEXT, _text(head), len(data), cut, note)
    if view is PayloadView.TEXT or (view is PayloadView.AUTO and reads_as_text(head)):
        return ShownPayload(PayloadView.TEXT, _text(head), len(data), cut)
    return ShownPayload(PayloadView.HEX, hex_dump(head), len(data), cut)


def reads_as_text(data: bytes) -> bool:
    """Whether ``data`` is UTF-8 with few control characters (a cut may split the last one)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(data) - 3:
            return False
        text = data[: exc.start].decode("utf-8")
    control = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r")
    return control <= MAX_CONTROL_SHARE * max(1, len(text))


def hex_dump(data: bytes) -> str:
    """Offset, hex bytes and printable ASCII, ``HEX_LINE_BYTES`` per line."""
    lines = []
    for offset in range(0, len(data), HEX_LINE_BYTES):
        chunk = data[offset : offset + HEX_LINE_BYTES]
        hexes = " ".join(f"{b:02x}" for b in chunk).ljust(HEX_LINE_BYTES * 3 - 1)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes}  {text}")
    return "\n".join(lines)


def _pretty_json(data: bytes) -> str | None:
    if not data.strip():
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
