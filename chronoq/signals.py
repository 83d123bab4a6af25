"""Stop signals: the one place chronoq programs install and restore SIGINT/SIGTERM handlers.

Asyncio programs call ``on_stop_signals`` (or ``stop_event``) inside their running loop.
Blocking code uses ``deferred_stop_signals`` (remember signals while something must not be
interrupted halfway) or ``stop_signals_interrupt`` (turn SIGTERM into ``KeyboardInterrupt`` so
``finally`` blocks run as they do for Ctrl-C).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
"""The signals that ask a chronoq program to stop."""

_Handler = Callable[[int, FrameType | None], object] | int | None


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
    """An event set on SIGINT or SIGTERM (call inside the running loop)."""
    stop = asyncio.Event()
    on_stop_signals(stop.set)
    return stop


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
