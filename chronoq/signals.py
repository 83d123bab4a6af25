"""Stop signals: the one place chronoq programs install and restore SIGINT/SIGTERM handlers.

Asyncio programs call ``on_stop_signals`` (or ``stop_event``) inside their running loop.
A child of a local stack (a node started by ``chronoq dev``) also stops when the process that
started it is gone, even by SIGKILL: ``stop_event`` watches the parent named in
``CHRONOQ_PARENT_PID``, so no orphaned node keeps serving a cluster nobody runs.
Blocking code uses ``deferred_stop_signals`` (remember signals while something must not be
interrupted halfway) or ``stop_signals_interrupt`` (turn SIGTERM into ``KeyboardInterrupt`` so
``finally`` blocks run as they do for Ctrl-C).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
"""The signals that ask a chronoq program to stop."""

_Handler = Callable[[int, FrameType | None], object] | int | None

log = logging.getLogger("chronoq.signals")

#: Set by a parent in a child's environment: the PID whose disappearance stops the child.
PARENT_PID_ENV = "CHRONOQ_PARENT_PID"
#: How often a watched child looks whether its parent is still there (seconds).
PARENT_CHECK_S = 1.0

_watchers: set[asyncio.Task[None]] = set()  # strong references to the running watches


def on_stop_signals(
    callback: Callable[[], None], *, loop: asyncio.AbstractEventLoop | None = None
) -> Callable[[], None]:
    """Call ``callback`` on SIGINT and SIGTERM; returns a function that removes the handlers.

    Args:
        callback: called in the loop's thread, once per signal received.
        loop: the loop to install on; the running loop when omitted.
    """
    loop = loop or asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, callback)

    def restore() -> None:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)

    return restore


def stop_event() -> asyncio.Event:
    """An event set on SIGINT or SIGTERM, or once the parent named in ``CHRONOQ_PARENT_PID``
    is gone (call inside the running loop)."""
    stop = asyncio.Event()
    on_stop_signals(stop.set)
    parent = watched_parent()
    if parent is not None:
        on_parent_gone(parent, stop.set)
    return stop


def watched_parent(environ: dict[str, str] | None = None) -> int | None:
    """The parent PID this process was asked to watch, if any (and still its parent)."""
    raw = (os.environ if environ is None else environ).get(PARENT_PID_ENV, "")
    try:
        pid = int(raw)
    except ValueError:
        return None
    return pid if pid > 1 else None


def on_parent_gone(parent: int, callback: Callable[[], None]) -> None:
    """Call ``callback`` once this process's parent is no longer ``parent`` (it exited and
    the child was handed to another; checked every ``PARENT_CHECK_S``)."""

    async def watch() -> None:
        while True:
            await asyncio.sleep(PARENT_CHECK_S)
            if os.getppid() != parent:
                break
        log.warning("the process that started this one (pid %d) is gone: stopping", parent)
        callback()

    task = asyncio.get_running_loop().create_task(watch(), name="chronoq-parent-watch")
    _watchers.add(task)
    task.add_done_callback(_watchers.discard)


def _install(handler: _Handler, signals: tuple[signal.Signals, ...]) -> dict[int, _Handler]:
    return {sig: signal.signal(sig, handler) for sig in signals}


def _restore(previous: dict[int, _Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@contextmanager
def deferred_stop_signals() -> Iterator[list[int]]:
    """Record SIGINT/SIGTERM instead of acting on them; yields the list of signals received.

    For blocking steps that must not stop halfway (starting a cluster); the caller checks the
    list afterwards and stops cleanly when it is not empty.
    """
    received: list[int] = []

    def remember(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = _install(remember, STOP_SIGNALS)
    try:
        yield received
    finally:
        _restore(previous)


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Raise ``KeyboardInterrupt`` on SIGTERM too, so cleanup in ``finally`` blocks runs."""

    def interrupted(signum: int, _frame: FrameType | None) -> None:
        # SIGTERM would end the process at once; as KeyboardInterrupt it unwinds the stack.
        raise KeyboardInterrupt(f"signal {signum}")

    previous = _install(interrupted, (signal.SIGTERM,))
    try:
        yield
    finally:
        _restore(previous)
