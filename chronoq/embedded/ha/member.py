"""One member of a replicated PostgreSQL: its files and its Patroni process.

A member's home (data, config, pgpass) belongs to the account Patroni runs as; ``spawn``
starts its Patroni in a session of its own, ``kill`` ends Patroni and every postgres process
on its data directory by PID (killing Patroni alone leaves postgres running). The cluster
(``chronoq.embedded.ha.cluster``) decides when.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chronoq.embedded import processes
from chronoq.embedded.ha.config import MemberAddress
from chronoq.embedded.ha.install import PatroniError

_LOG_TAIL_LINES = 30


def free_ports(hosts: Sequence[str]) -> list[int]:
    """A free TCP port on each of ``hosts``, all bound at once so none is handed out twice."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in hosts]
    try:
        for sock, host in zip(sockets, hosts, strict=True):
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def signal_pid(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to ``pid`` unless it is gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


@dataclass
class Member:
    """One member's files and its Patroni process."""

    address: MemberAddress
    home: Path  # owned by the member's account: data, config, pgpass
    log_file: Path
    socket_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.address.name

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def config_file(self) -> Path:
        return self.home / "patroni.yml"

    @property
    def patroni_pid(self) -> int | None:
        """Patroni's PID while it runs (reaps it once it exited)."""
        if self.process is not None and self.process.poll() is None:
            return self.process.pid
        return None

    @property
    def postmaster_pid(self) -> int | None:
        """The postmaster's PID from ``postmaster.pid``, while that process is a live postgres."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = abs(int((self.data_dir / "postmaster.pid").read_text().splitlines()[0]))
            if processes.process_name(pid) == "postgres":
                return pid
        return None

    def spawn(self, patroni: Path, user: pwd.struct_passwd | None) -> None:
        """Start Patroni on this member's config, as ``user`` (None: this account)."""
        for lock in processes.clear_stale_locks(self.data_dir):
            del lock  # a killed member's postmaster.pid: postgres refuses to start on it
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LC_ALL": "C.UTF-8",
            "LANG": "C.UTF-8",
            "HOME": str(self.home),
        }
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [str(patroni), str(self.config_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.home,
                user=user.pw_uid if user else None,
                group=user.pw_gid if user else None,
                extra_groups=[] if user else None,
                start_new_session=True,  # a Ctrl-C aimed at chronoq must not reach it
            )

    def kill(self, bin_dir: Path) -> None:
        """SIGKILL Patroni and every postgres process on the member's data directory."""
        if (pid := self.patroni_pid) is not None:
            signal_pid(pid, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        deadline = time.monotonic() + 10
        while pids := processes.server_pids(self.data_dir, bin_dir):
            for pid in pids:
                signal_pid(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise PatroniError(f"postgres processes {pids} of {self.name} survived SIGKILL")
            time.sleep(0.02)


def traversable(path: Path) -> None:
    """o+x (pass, not list) on ``path`` and its parents, so the member's account reaches it."""
    for p in (path, *path.parents):
        mode = p.stat().st_mode
        if not mode & 0o001:
            p.chmod(mode | 0o001)


def tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError as exc:
        return f"<cannot read: {exc}>"
    return "\n".join(lines[-_LOG_TAIL_LINES:])
