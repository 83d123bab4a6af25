"""The one writer of files that hold secrets (passwords, the HA stack's secrets): 0600 from
the first byte, never through a link, a new file or an atomic replacement."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from chronoq.coordinator.credentials import read_password
from chronoq.private_files import write_password, write_private


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_new_secret_is_0600_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    old = os.umask(0)  # even a permissive umask leaves it private
    try:
        write_password(path, "s3cret")
    finally:
        os.umask(old)
    assert _mode(path) == 0o600 and read_password(path) == "s3cret"
    with pytest.raises(FileExistsError):
        write_password(path, "other")
    assert read_password(path) == "s3cret"


def test_a_replacement_is_whole_and_private_and_clears_a_cut_short_write(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    path.write_text("{}")
    path.chmod(0o644)
    (tmp_path / "secrets.json.partial").write_text("half")  # a write cut short
    write_private(path, '{"a": "b"}', replace=True)
    assert path.read_text() == '{"a": "b"}' and _mode(path) == 0o600
    assert not (tmp_path / "secrets.json.partial").exists()


@pytest.mark.parametrize("replace", [False, True])
def test_a_link_planted_in_its_place_is_not_followed(tmp_path: Path, replace: bool) -> None:
    victim = tmp_path / "victim"
    victim.write_text("mine")
    path = tmp_path / "pw"
    planted = path.with_name("pw.partial") if replace else path
    planted.symlink_to(victim)
    if replace:
        write_password(path, "s3cret", replace=True)  # the stale link is removed, not followed
        assert read_password(path) == "s3cret"
    else:
        with pytest.raises(FileExistsError):
            write_password(path, "s3cret")
    assert victim.read_text() == "mine"
