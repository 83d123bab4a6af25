"""Run one node until asked to stop: the body of ``chronoq node``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from chronoq.clock import Clock, OffsetClock
from chronoq.config import NodeSettings
from chronoq.coordinator.vclock import EtcdClock
from chronoq.heap import freeze_startup_heap
from chronoq.node.node import Node


async def serve(
    settings: NodeSettings,
    stop: asyncio.Event,
    *,
    virtual_clock: bool = False,
    clock_offset: timedelta = timedelta(0),
    clock_offset_file: Path | None = None,
    started: Callable[[Node], None] = lambda _node: None,
    stopping: Callable[[], None] = lambda: None,
) -> None:
    """Start a node, call ``started``, and stop it gracefully once ``stop`` is set.

    Args:
        settings: the node's settings; ``virtual_clock`` needs ``settings.cluster``.
        stop: set to stop the node.
        virtual_clock: fire by the cluster's shared virtual clock in etcd.
        clock_offset: run the node's clock this far ahead (the chaos clock-jump fault).
        clock_offset_file: shift it further by the offset this file holds, as it changes
            (the chaos clock-drift fault; see ``clock_file``).
        started: called once the node serves.
        stopping: called once ``stop`` is set, before the node stops.

    Raises:
        RuntimeError, OSError: the node could not start (e.g. its port is taken).
    """
    async with contextlib.AsyncExitStack() as stack:
        clock: Clock | None = None
        vclock = await _virtual_clock(settings, stack) if virtual_clock else None
        if vclock is not None:
            clock = vclock
        elif clock_offset or clock_offset_file is not None:
            # A deliberately skewed system clock (chaos clock faults); never in production.
            clock = OffsetClock(clock_offset)
            if clock_offset_file is not None:
                await _follow_offset_file(clock, clock_offset_file, clock_offset, stack)
        node = Node(settings, clock=clock)
        if vclock is not None:
            vclock.on_jump = node.clock_jumped
        try:
            await node.start()
        except BaseException:
            await node.stop(grace=0)
            raise
        stack.push_async_callback(node.stop)
        freeze_startup_heap()
        started(node)
        await stop.wait()
        stopping()


async def _follow_offset_file(
    clock: OffsetClock, path: Path, base: timedelta, stack: contextlib.AsyncExitStack
) -> None:
    from chronoq.node.clock_file import follow

    task = asyncio.create_task(follow(clock, path, base), name="clock-offset-file")
    await asyncio.sleep(0)  # the first reading, before the node measures its clock

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(stop)


async def _virtual_clock(settings: NodeSettings, stack: contextlib.AsyncExitStack) -> EtcdClock:
    if settings.cluster is None:
        raise ValueError("the virtual clock lives in etcd: the node needs a cluster")
    clock = EtcdClock(settings.cluster.etcd)
    await clock.start()
    stack.push_async_callback(clock.stop)
    return clock
