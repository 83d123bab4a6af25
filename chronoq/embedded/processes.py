"""PostgreSQL processes and lock files, seen through ``/proc`` (Linux).

Finds the processes of a data directory (orphaned backends included) and tells a live
postmaster's lock files from the stale ones a crash leaves behind.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

__all__ = ["alive", "clear_stale_locks", "lock_holder", "process_name", "server_pids"]


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a zombie holds no resources)."""
    return process_name(pid) is not None


def server_pids(data_dir: Path, bin_dir: Path) -> list[int]:
    """PIDs of the postgres processes (postmaster and children) running on ``data_dir``.

    The postmaster chdirs into its data directory and its forked children inherit that, so the
    cwd link also finds orphaned backends of a killed postmaster, which still hold the shared
    memory segment and make a new postmaster refuse to start.
    """
    binary = os.path.realpath(bin_dir / "postgres")
    target = os.path.realpath(data_dir)
    pids: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/cwd") != target:
                continue
            if os.readlink(f"/proc/{name}/exe") != binary:
                continue
        except OSError:
            continue
        pids.append(int(name))
    return pids


def process_name(pid: int) -> str | None:
    """The command name of a live, non-zombie ``pid`` (readable for any user's process)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, _, rest = raw.partition(" (")[2].rpartition(")")
    return name if rest.split()[0] not in ("Z", "X") else None


def lock_holder(lock_file: Path, data_dir: Path) -> int | None:
    """The PID of the postgres process that still holds ``lock_file``, or None if stale.

    ``lock_file`` is ``postmaster.pid`` or a socket's ``.s.PGSQL.<port>.lock``; both start
    with the postmaster's PID. It is held when that PID is a live postgres process on
    ``data_dir``; a dead PID, a zombie, or a PID reused by another program (seen after a
    crash in containers, where PIDs are small) holds nothing. When the process's working
    directory cannot be read (another user's), a live ``postgres`` is taken to hold it.
    """
    try:
        pid = abs(int(lock_file.read_text().splitlines()[0]))
    except (OSError, ValueError, IndexError):
        return None
    if pid == 0 or process_name(pid) != "postgres":
        return None
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return pid
    return pid if cwd == os.path.realpath(data_dir) else None


def clear_stale_locks(data_dir: Path, socket_dir: Path | None = None) -> list[Path]:
    """Remove the lock files of a dead postmaster on ``data_dir``; return what was removed.

    postgres refuses to start while a lock file names a PID that looks alive to it (any
    process, or our own unreaped child), so a crash followed by PID reuse would otherwise
    need an operator to delete the files by hand. Only files that no live postgres on
    ``data_dir`` holds are removed.
    """
    candidates = [data_dir / "postmaster.pid"]
    if socket_dir is not None and socket_dir.is_dir():
        candidates += sorted(socket_dir.glob(".s.PGSQL.*.lock"))
    removed = []
    for lock_file in candidates:
        if lock_file.exists() and lock_holder(lock_file, data_dir) is None:
            with contextlib.suppress(FileNotFoundError):
                lock_file.unlink()
                removed.append(lock_file)
    return removed


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` now; the OS picks it, so parallel runs differ."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
