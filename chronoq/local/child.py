"""One child process of a local stack: started in its own session with its output in a log
file, signalled like an operator would (SIGSTOP/SIGCONT tracked), stopped gracefully with a
deadline and then by SIGKILL, always reaped by PID.

Nodes of a ``LocalCluster``, the chaos harness's workers and the benchmarks' worker processes
are all such children; keeping them running is ``chronoq.embedded.supervisor``'s job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from chronoq.signals import PARENT_PID_ENV

#: How long a SIGKILLed child may take to be reaped (seconds).
REAP_AFTER_KILL_S = 5.0
#: How many of a log's last lines go into an error message.
LOG_TAIL_LINES = 30


@dataclass
class ChildProcess:
    """A process started by ``spawn``; ``log_file`` collects its stdout and stderr."""

    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # SIGSTOPped by us

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        """True while it runs (also while SIGSTOPped); polling reaps an exited child."""
        return self.process is not None and self.process.poll() is None

    def running_pid(self) -> int | None:
        """The PID while the process runs; None once it exited."""
        return self.pid if self.alive() else None

    def spawn(self, args: list[str], env: Mapping[str, str] | None = None) -> None:
        """Start ``args`` in a session of its own (a signal to our group does not reach it);
        a chronoq child stops by itself once this process is gone (``PARENT_PID_ENV``)."""
        environ = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            PARENT_PID_ENV: str(os.getpid()),
            **(env or {}),
        }
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environ,
                start_new_session=True,
            )
        self.stopped = False

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` if the process still runs; remembers SIGSTOP/SIGCONT."""
        if self.process is None or not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, sig)
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.signal(signal.SIGKILL)
        self.reap(REAP_AFTER_KILL_S)

    def terminate(self, timeout: float) -> float:
        """Wake (if stopped) and SIGTERM, reap within ``timeout`` or SIGKILL; returns how long
        the process took to go."""
        started = time.monotonic()
        if self.stopped:
            self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        self.reap(timeout)
        return time.monotonic() - started

    def reap(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the exit, then SIGKILL and wait for that."""
        if self.process is None:
            return
        try:
            self.process.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(REAP_AFTER_KILL_S)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop_all(children: Iterable[ChildProcess], grace: float) -> None:
    """Wake and SIGTERM every child at once (a graceful handoff each), then reap them all
    within one shared ``grace``; SIGKILL whatever is still there after it."""
    running = [c for c in children if c.alive()]
    for child in running:
        child.signal(signal.SIGCONT)
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in running:
        child.reap(deadline - time.monotonic())
