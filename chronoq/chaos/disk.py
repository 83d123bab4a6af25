"""A size-capped filesystem under PostgreSQL's data directory, for the disk-full fault.

The harness mounts a tmpfs of ``size`` MiB on the (still empty) data directory before initdb,
so the server's own writes meet a real ENOSPC once it is full: ``fill`` takes every free byte
with one ballast file, ``free`` removes it. A tmpfs survives a SIGKILL of the server (its pages
are the kernel's), so crash recovery still finds every committed byte. Mounting needs root
(CAP_SYS_ADMIN); where it is refused or does not answer, ``mount`` returns the reason and the
fault is skipped, never waited on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger("chronoq.chaos")

#: The filesystem's size: room for a long run's tables and WAL (with ``MAX_WAL_SIZE``).
CAPPED_DISK_MB = 1024
#: PostgreSQL's max_wal_size on the capped disk: the WAL between checkpoints must fit.
MAX_WAL_SIZE = "256MB"
#: Longest a mount or unmount may take before it is given up on.
MOUNT_TIMEOUT_S = 10.0
BALLAST = "chaos-ballast"
#: The most of the ballast one allocation asks for, and the least after halvings.
FILL_STEP = 64 * 1024 * 1024
LEAST_FILL_STEP = 64 * 1024
#: Bound of the fill's allocations (steps to fill the disk plus halvings from ENOSPC).
MAX_FILL_STEPS = 256


class CappedDisk:
    """A tmpfs of ``size_mb`` MiB mounted on ``path``; ``fill`` and ``free`` its space."""

    def __init__(self, path: Path, size_mb: int = CAPPED_DISK_MB) -> None:
        self.path = path
        self.size_mb = size_mb
        self.mounted = False

    @property
    def ballast(self) -> Path:
        return self.path / BALLAST

    def mount(self) -> str | None:
        """Mount it; None when done, else why it could not be (the fault is then skipped)."""
        if os.geteuid() != 0:
            return "mounting a size-capped filesystem needs root"
        if shutil.which("mount") is None or shutil.which("umount") is None:
            return "no mount/umount command on this machine"
        self.path.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(self.path):  # left by an earlier run that did not stop
            self._umount()
        if any(self.path.iterdir()):
            return f"{self.path} is not empty: the data directory must start on the new disk"
        why = _run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0700", "tmpfs",
                    str(self.path)])
        if why is None:
            self.mounted = True
        return why

    def fill(self) -> int:
        """Take every free byte with the ballast file; returns its size in bytes.

        The space goes in steps of at most ``FILL_STEP`` bytes, halved after an ENOSPC: a
        server writing meanwhile makes an allocation of all that was free fail whole (the
        kernel undoes it), which left no ballast at all when it was asked for in one piece."""
        fd = os.open(self.ballast, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            step = FILL_STEP
            for _ in range(MAX_FILL_STEPS):
                free = shutil.disk_usage(self.path).free
                if free <= 0:
                    break
                want = min(step, free)
                try:
                    os.posix_fallocate(fd, os.fstat(fd).st_size, want)
                except OSError as exc:  # ENOSPC: the server took some of it first
                    log.info("ballast: %s", exc)
                    if want <= LEAST_FILL_STEP:
                        break  # not a page left that the server does not race for: full
                    step = max(want // 2, LEAST_FILL_STEP)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def free(self) -> None:
        """Remove the ballast (nothing to do when there is none)."""
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    def unmount(self) -> None:
        """Unmount (the server must be stopped); lazily when something still holds it."""
        if self.mounted:
            self._umount()
            self.mounted = False

    def _umount(self) -> None:
        if _run(["umount", str(self.path)]) is not None:
            why = _run(["umount", "-l", str(self.path)])
            if why is not None:
                log.warning("could not unmount %s: %s", self.path, why)


def _run(cmd: list[str]) -> str | None:
    """Run a mount command; None when it worked, else what went wrong. Never waits past the
    timeout: a mount stuck in the kernel is killed and left, not waited for."""
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        return f"{cmd[0]}: {exc}"
    try:
        _out, err = proc.communicate(timeout=MOUNT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1.0)
        return f"{cmd[0]} did not answer within {MOUNT_TIMEOUT_S:g} s"
    if proc.returncode != 0:
        return f"{' '.join(cmd[:3])} … failed: {(err or '').strip()[:200]}"
    return None
