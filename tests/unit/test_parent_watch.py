"""A child started by a local stack stops by itself once its parent is gone, even when the
parent was SIGKILLed and had no chance to stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from chronoq.signals import PARENT_PID_ENV, watched_parent

# The grandchild: waits on ``stop_event()`` like ``chronoq node`` does, then writes a mark.
CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from chronoq.signals import stop_event

    async def main() -> None:
        stop = stop_event()
        print("waiting", flush=True)
        await asyncio.wait_for(stop.wait(), timeout=60)
        open(sys.argv[1], "w").write("stopped")

    asyncio.run(main())
    """
)

# The parent: starts the grandchild as a local stack starts a node, prints its PID, then
# hangs until SIGKILLed.
PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from chronoq.local.child import ChildProcess

    child = ChildProcess(Path(sys.argv[1]))
    child.spawn([sys.executable, "-c", sys.argv[2], sys.argv[3]])
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def test_a_child_stops_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "child.log"), CHILD, str(mark)],
        stdout=subprocess.PIPE,
        text=True,
    )
    child_pid = 0
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        log = tmp_path / "child.log"
        deadline = time.monotonic() + 30
        while "waiting" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        assert not mark.exists()  # the parent lives: the child keeps running
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 15
        while not mark.exists():
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.1)
        assert mark.read_text() == "stopped"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child_pid:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_only_a_valid_pid_is_watched() -> None:
    assert watched_parent({PARENT_PID_ENV: "4242"}) == 4242
    assert watched_parent({}) is None
    assert watched_parent({PARENT_PID_ENV: "not a pid"}) is None
    assert watched_parent({PARENT_PID_ENV: "1"}) is None  # init: the parent is already gone
