"""The dev stack's child supervisor with fake children: a child that dies is started again
after the backoff, with one line when it exits and one when it is back; a child that fails
to start is retried; with restarts off it is only reported."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from chronoq.embedded.restarts import RestartBackoff
from chronoq.embedded.supervisor import Child, Supervisor


@dataclass
class FakeProcess:
    pid: int | None = 100
    starts: int = 0
    failures_left: int = 0
    changes: list[str] = field(default_factory=list)

    def running_pid(self) -> int | None:
        return self.pid

    def start(self) -> None:
        self.starts += 1
        if self.failures_left:
            self.failures_left -= 1
            raise RuntimeError("exited while starting\nlog tail that stays out of the log line")
        self.pid = 100 + self.starts


def quick() -> RestartBackoff:
    return RestartBackoff(initial=0.01, maximum=0.04)


async def until(condition: object, what: str) -> None:
    for _ in range(400):  # bounded: 4 s
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_a_dead_child_is_restarted_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "chronoq.supervisor")
    child = FakeProcess(failures_left=2)
    changed: list[int | None] = []
    supervisor = Supervisor(
        [Child("node n1", child.running_pid, child.start)],
        on_change=lambda: changed.append(child.pid),
        poll_interval=0.01,
        backoff=quick,
    )
    supervisor.start()
    try:
        child.pid = None  # it died
        await until(lambda: child.pid is not None, "not restarted")
        assert child.starts == 3 and supervisor.restarts == {"node n1": 1}
        assert changed == [103]
        child.pid = None  # and again
        await until(lambda: child.pid == 104, "not restarted twice")
    finally:
        await supervisor.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "node n1 (pid 100) exited; restarting it in 0.0 s"
    assert lines[1] == "node n1 did not start (attempt 1): exited while starting"
    assert lines[3] == "node n1 restarted: pid 103 after 3 attempts"
    assert "node n1 restarted: pid 104" in lines


async def test_without_restarts_an_exit_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "chronoq.supervisor")
    child = FakeProcess()
    changed: list[int | None] = []
    supervisor = Supervisor(
        [Child("PostgreSQL", child.running_pid, child.start)],
        restart=False,
        on_change=lambda: changed.append(child.pid),
        poll_interval=0.01,
        backoff=quick,
    )
    supervisor.start()
    try:
        child.pid = None
        await asyncio.sleep(0.3)
    finally:
        await supervisor.stop()
    assert child.starts == 0 and changed == [None]
    assert [r.getMessage() for r in caplog.records] == [
        "PostgreSQL (pid 100) exited; not restarting it (--no-restart)"
    ]


async def test_a_pid_restarted_by_another_program_rewrites_the_state() -> None:
    """A postmaster that Patroni restarts is no child (nothing of ours exits): ``observe``
    sees its new PID and ``on_change`` runs once per change, not on every look."""
    postmaster = [200]
    changed: list[int] = []
    supervisor = Supervisor(
        [],
        on_change=lambda: changed.append(postmaster[0]),
        poll_interval=0.01,
        backoff=quick,
        observe=lambda: tuple(postmaster),
    )
    supervisor.start()
    try:
        await asyncio.sleep(0.1)
        assert changed == []
        postmaster[0] = 201  # killed and started again by someone else
        await until(lambda: changed == [201], "the new PID was not seen")
        await asyncio.sleep(0.1)
        assert changed == [201]
    finally:
        await supervisor.stop()
