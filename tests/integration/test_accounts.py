"""The server accounts made by processes that start at once (a fresh machine, two shards)."""

from __future__ import annotations

import multiprocessing
import os
import pwd
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from chronoq.embedded.accounts import system_account

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root and useradd"
)

PROCESSES = 6
ROUNDS = 4


def _useradd(name: str) -> None:
    subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        capture_output=True,
        check=False,
        timeout=60,
    )


def _made(args: tuple[Any, str]) -> tuple[int, int]:
    barrier, name = args
    barrier.wait(timeout=60)
    account = system_account(name, _useradd)
    assert account is not None
    return account.pw_uid, account.pw_gid


@pytest.fixture
def names() -> Iterator[list[str]]:
    made = [f"cq-acct-{secrets.token_hex(4)}" for _ in range(ROUNDS)]
    try:
        yield made
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, check=False, timeout=60)
            subprocess.run(["groupdel", name], capture_output=True, check=False, timeout=60)


def test_processes_that_make_one_account_at_once_all_get_the_one_that_exists(
    names: list[str],
) -> None:
    ctx = multiprocessing.get_context("fork")
    for name in names:
        with ctx.Manager() as manager:
            barrier = manager.Barrier(PROCESSES)
            with ctx.Pool(PROCESSES) as pool:
                seen = pool.map(_made, [(barrier, name)] * PROCESSES, chunksize=1)
        there = pwd.getpwnam(name)
        # Without the lock, two useradds both succeed and the first one's uid is gone.
        assert set(seen) == {(there.pw_uid, there.pw_gid)}, (name, seen)
