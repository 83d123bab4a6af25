"""Stale lock files of a dead postmaster are cleared before a start; live ones never are.

postgres itself refuses to start while ``postmaster.pid`` (or the socket's
``.s.PGSQL.<port>.lock``) names a PID that looks alive: after a crash the PID may have been
reused by another program, or still be an unreaped zombie.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chronoq.embedded.postgres import EmbeddedPostgres, clear_stale_locks, lock_holder


@pytest.fixture
def stranger() -> Iterator[int]:
    """A live process that is not postgres: what a reused PID points at."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def rewrite_pid(lock_file: Path, pid: int) -> None:
    """Keep the file's other lines (data directory, port, ...), replace the PID."""
    lines = lock_file.read_text().splitlines()
    lock_file.write_text("\n".join([str(pid), *lines[1:]]) + "\n")


def crash(pg: EmbeddedPostgres) -> tuple[Path, Path]:
    """SIGKILL the postmaster by PID and wait until it and its backends are gone; return the
    lock files it left behind."""
    pid = pg.pid
    assert pid is not None
    socket_lock = next(Path(pg._socket_dir or "/nonexistent").glob(".s.PGSQL.*.lock"))
    os.kill(pid, signal.SIGKILL)
    for _ in range(200):  # bounded: 10 s
        if pg.pid is None and not [p for p in pg.server_pids() if p != pid]:
            break
        for orphan in pg.server_pids():
            os.kill(orphan, signal.SIGKILL)
        time.sleep(0.05)
    postmaster_pid = pg.data_dir / "postmaster.pid"
    assert postmaster_pid.exists() and socket_lock.exists()
    return postmaster_pid, socket_lock


def test_live_lock_files_are_kept(pg: EmbeddedPostgres) -> None:
    lock_file = pg.data_dir / "postmaster.pid"
    assert lock_holder(lock_file, pg.data_dir) == pg.pid
    assert clear_stale_locks(pg.data_dir, pg._socket_dir) == []
    assert lock_file.exists()
    assert list(Path(pg._socket_dir or "/nonexistent").glob(".s.PGSQL.*.lock"))
    pg.run_sql("SELECT 1")


def test_lock_file_of_a_dead_pid_is_cleared(pg: EmbeddedPostgres) -> None:
    postmaster_pid, socket_lock = crash(pg)
    for lock_file in (postmaster_pid, socket_lock):
        rewrite_pid(lock_file, dead_pid())
        assert lock_holder(lock_file, pg.data_dir) is None
    assert set(clear_stale_locks(pg.data_dir, pg._socket_dir)) == {postmaster_pid, socket_lock}
    assert not postmaster_pid.exists() and not socket_lock.exists()


def test_reused_pid_does_not_block_a_restart(pg: EmbeddedPostgres, stranger: int) -> None:
    """The crashed postmaster's PID now belongs to another program: postgres alone would
    refuse ("lock file already exists"); start() clears the files and recovers."""
    postmaster_pid, socket_lock = crash(pg)
    rewrite_pid(postmaster_pid, stranger)
    rewrite_pid(socket_lock, stranger)
    assert lock_holder(postmaster_pid, pg.data_dir) is None
    pg.start(60)
    assert pg.pid is not None and pg.pid != stranger
    assert pg.run_sql("SELECT 41 + 1").strip() == "42"
    assert os.kill(stranger, 0) is None  # the other program was left alone


def test_postgres_of_another_data_dir_does_not_hold_ours(
    pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    """A PID reused by a postgres serving some other data directory holds nothing here."""
    other = EmbeddedPostgres(tmp_path / "other", durable=False)
    lock_file = tmp_path / "postmaster.pid"
    assert pg.pid is not None
    lock_file.write_text(f"{pg.pid}\n{other.data_dir}\n")
    assert lock_holder(lock_file, other.data_dir) is None
    assert lock_holder(lock_file, pg.data_dir) == pg.pid
