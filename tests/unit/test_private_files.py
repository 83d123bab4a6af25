"""A token file another account could rewrite or replace is refused, saying what to fix.

The attack: another local account replaces the token file through a directory it may write
(or owns), or owns the file itself, and grants itself ``*``. These tests make such files and
directories for real (another uid by ``chown``, run as root) and, for the replacement, act as
that other account in a child process.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chronoq.auth import TokenAuth, TokenFile
from chronoq.errors import ConfigError

TOKEN = "tok-a-0123456789abcdef"
TEXT = f'[tokens]\n"{TOKEN}" = ["team-a"]\n'
OTHER_UID = 54321  # an account that is neither us nor root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another uid")


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory of ours under /tmp (root's, sticky), which another uid may traverse: the
    pytest tmp_path sits under a 0700 directory, where no other account could act at all."""
    path = Path(tempfile.mkdtemp(prefix="chronoq-private-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=True)


def _file(path: Path, mode: int = 0o600, uid: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TEXT)
    path.chmod(mode)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def test_a_private_file_in_private_directories_is_read(base: Path) -> None:
    assert len(TokenAuth.from_file(_file(base / "tokens.toml"))) == 1


def test_a_file_another_account_owns_is_refused(base: Path) -> None:
    path = _file(base / "tokens.toml", uid=OTHER_UID)
    with pytest.raises(ConfigError, match=f"belongs to uid {OTHER_UID}.*chown 0 {path}"):
        TokenFile(path)


def test_a_directory_others_may_write_is_refused(base: Path) -> None:
    path = _file(base / "open" / "tokens.toml")
    path.parent.chmod(0o777)
    with pytest.raises(ConfigError, match=f"lies in {path.parent}, which group or others may "
                       rf"write \(mode drwxrwxrwx\).*chmod go-w {path.parent}"):
        TokenFile(path)
    path.parent.chmod(0o775)  # group-writable: the same
    with pytest.raises(ConfigError, match="group or others may write"):
        TokenFile(path)


def test_a_directory_higher_up_counts_too(base: Path) -> None:
    """Whoever may write a grandparent can rename the parent away and put their own there."""
    path = _file(base / "open" / "private" / "tokens.toml")
    path.parent.chmod(0o700)
    path.parent.parent.chmod(0o777)
    with pytest.raises(ConfigError, match=f"lies in {path.parent.parent},"):
        TokenFile(path)


def test_a_sticky_directory_is_fine_when_ours_or_roots_only(base: Path) -> None:
    path = _file(base / "sticky" / "tokens.toml")
    path.parent.chmod(0o1777)  # like /tmp: others may add files, not replace ours
    assert len(TokenFile(path).current()) == 1
    os.chown(path.parent, OTHER_UID, -1)  # but its owner may do anything in it
    with pytest.raises(ConfigError, match=f"which belongs to uid {OTHER_UID}.*chown 0"):
        TokenFile(path)


def test_a_directory_another_account_owns_is_refused(base: Path) -> None:
    path = _file(base / "theirs" / "tokens.toml")
    path.parent.chmod(0o755)
    os.chown(path.parent, OTHER_UID, -1)
    with pytest.raises(ConfigError, match=f"lies in {path.parent}, which belongs to uid"):
        TokenFile(path)


def test_a_link_is_judged_by_where_it_leads_too(base: Path) -> None:
    target = _file(base / "open" / "tokens.toml")
    target.parent.chmod(0o777)
    link = base / "private" / "tokens.toml"
    link.parent.mkdir()
    link.symlink_to(target)
    with pytest.raises(ConfigError, match=f"lies in {target.parent},"):
        TokenFile(link)


def test_a_file_replaced_through_an_open_directory_grants_nothing(base: Path) -> None:
    """The attack of the issue: the directory is opened (a mistaken chmod 777), another
    account writes a file granting itself ``*`` and renames it over the token file. The node
    refuses the change and keeps the tokens in force."""
    path = _file(base / "conf" / "tokens.toml")
    ticks = _Ticks()
    tokens = TokenFile(path, interval=1.0, monotonic=ticks)
    path.parent.chmod(0o777)
    evil = f'[tokens]\n"{TOKEN}" = ["*"]\n'
    # What the other account runs: write its own file, then rename it over ours.
    attack = 'printf %s "$2" > "$1.new" && chmod 600 "$1.new" && mv -f "$1.new" "$1"'
    subprocess.run(
        ["/bin/sh", "-c", attack, "sh", str(path), evil], user=OTHER_UID, cwd="/", check=True
    )
    assert path.stat().st_uid == OTHER_UID and "*" in path.read_text()  # the attack landed
    ticks.now = 1.0
    assert not tokens.current().authenticate(TOKEN).admin
    assert tokens.reloads == 0
    with pytest.raises(ConfigError, match="belongs to uid"):
        TokenFile(path)  # nor does a node started now take it


def test_a_fifo_in_place_of_the_file_is_refused_without_hanging(base: Path) -> None:
    path = base / "tokens.toml"
    os.mkfifo(path, 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        TokenFile(path)


class _Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
