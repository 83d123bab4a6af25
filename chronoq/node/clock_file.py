"""A node clock steered from a file: the chaos harness's clock-drift fault; never in production.

The harness drifts a running node's clock by rewriting one small file with an offset in
milliseconds; the node rereads it every ``FOLLOW_INTERVAL`` and shifts its ``OffsetClock`` by
it (on top of a fixed ``--clock-offset-ms``). No restart, so the node's clock check has to
notice the drift by itself, as it would a real one.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from pathlib import Path

from chronoq.clock import OffsetClock

log = logging.getLogger("chronoq.node")

FOLLOW_INTERVAL = timedelta(milliseconds=100)
#: The file holds one integer: a few bytes; anything longer is not ours.
MAX_FILE_BYTES = 64


def parse_offset(text: bytes) -> timedelta | None:
    """The offset a file holds (``-250``), or None when it does not hold one."""
    if len(text) > MAX_FILE_BYTES:
        return None
    try:
        return timedelta(milliseconds=int(text.strip() or b"0"))
    except ValueError:
        return None


async def follow(clock: OffsetClock, path: Path, base: timedelta) -> None:
    """Keep ``clock.offset`` at ``base`` plus the file's offset until cancelled (a missing
    file is 0; an unreadable one keeps the last offset)."""
    warned = False
    while True:
        try:
            with path.open("rb") as f:
                extra = parse_offset(f.read(MAX_FILE_BYTES + 1))
        except FileNotFoundError:
            extra = timedelta(0)
        except OSError as exc:
            extra = None
            if not warned:
                log.warning("clock offset file %s: %s", path, exc)
        if extra is not None:
            clock.offset = base + extra
        elif not warned:
            log.warning("clock offset file %s holds no offset in ms; keeping the last", path)
        warned = extra is None
        await asyncio.sleep(FOLLOW_INTERVAL.total_seconds())
