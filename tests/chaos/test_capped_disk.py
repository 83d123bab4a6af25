"""The disk-full fault's filesystem: a real size-capped tmpfs that fills to ENOSPC and frees,
and a mount that cannot be had degrades to a reason, never to a hang."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from chronoq.chaos import disk as disk_module
from chronoq.chaos.disk import CappedDisk

pytestmark = pytest.mark.timeout(60)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a filesystem needs root")
def test_a_capped_disk_fills_to_enospc_and_frees(tmp_path: Path) -> None:
    d = CappedDisk(tmp_path / "data", size_mb=16)
    why = d.mount()
    if why is not None:
        pytest.skip(f"no tmpfs here: {why}")
    try:
        assert os.path.ismount(d.path)
        assert d.fill() >= 15 * 1024 * 1024
        with pytest.raises(OSError, match="No space left"), (d.path / "row").open("wb") as f:
            f.write(b"x" * 65536)
            f.flush()
            os.fsync(f.fileno())
        d.free()
        (d.path / "row").write_bytes(b"x" * 65536)  # space is back
        assert shutil.disk_usage(d.path).free > 15 * 1024 * 1024
    finally:
        d.unmount()
    assert not os.path.ismount(d.path)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a filesystem needs root")
def test_a_disk_written_meanwhile_still_fills(tmp_path: Path) -> None:
    """A writer taking pages while the ballast is made (as the server does) makes one
    allocation of all that was free fail whole; the fill still ends with the disk full."""
    d = CappedDisk(tmp_path / "data", size_mb=32)
    why = d.mount()
    if why is not None:
        pytest.skip(f"no tmpfs here: {why}")
    stop = threading.Event()

    def write(name: str) -> None:  # 64 KiB at a time, kept under 1 MiB, until stopped
        with (d.path / name).open("wb", buffering=0) as f:
            while not stop.is_set():
                with contextlib.suppress(OSError):  # full: as the server, try again
                    f.write(b"x" * 65536)
                    if f.tell() > 1024 * 1024:
                        f.seek(0)
                        f.truncate()

    writers = [threading.Thread(target=write, args=(f"wal{i}",)) for i in range(4)]
    try:
        for w in writers:
            w.start()
        time.sleep(0.1)
        filled = [d.fill() for _ in range(10) if not d.free()]
        assert all(size >= 20 * 1024 * 1024 for size in filled), filled
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=10)
        d.unmount()


def test_without_root_the_fault_is_skipped_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_module.os, "geteuid", lambda: 1000)
    assert CappedDisk(tmp_path / "data").mount() == "mounting a size-capped filesystem needs root"


def test_a_refused_mount_is_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_module.os, "geteuid", lambda: 0)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "PG_VERSION").write_text("18")
    why = CappedDisk(tmp_path / "data").mount()
    assert why is not None and "not empty" in why  # never mounted over a data directory


def test_a_mount_that_does_not_answer_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_module, "MOUNT_TIMEOUT_S", 0.5)
    started = time.monotonic()
    why = disk_module._run(["sleep", "30"])  # a mount stuck in the kernel, as seen from here
    assert why is not None and "did not answer" in why
    assert time.monotonic() - started < 10
