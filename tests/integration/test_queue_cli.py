"""``chronoq queue set|pause|resume|show|list`` against a real node: tables, and one red line
for what a node refuses or the command cannot send."""

from __future__ import annotations

from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory
from tests.integration.test_cli import cli, failed, ok


async def test_queue_commands_pause_resume_and_set(make_node: NodeFactory, store: Store) -> None:
    node: Node = await make_node()
    a = ("-a", node.address)
    assert "paused" in ok(await cli("queue", "pause", "mails", *a))
    assert (await store.queue_settings("default", "mails")).paused
    assert "mails" in ok(await cli("queue", "list", *a))
    out = ok(await cli("queue", "resume", "mails", *a))
    assert "resumed mails: 0 tasks skipped" in out
    ok(await cli("queue", "set", "mails", "--max-running-per-key", "2", *a))
    settings = await store.queue_settings("default", "mails")
    assert (settings.max_running_per_key, settings.max_starts_per_key) == (2, 0.0)
    assert "2" in ok(await cli("queue", "show", "mails", *a))

    failed(await cli("queue", "set", "mails", *a), 2, "--max-running-per-key")
    failed(await cli("queue", "set", "mails", "--max-running-per-key", "-1", *a), 2,
           "--max-running-per-key")
    failed(await cli("queue", "set", "mails", "--max-running-per-key", "20000", *a), 1,
           "max_running_per_key", "10000")
    failed(await cli("queue", "set", "mails", "--max-starts-per-key", "inf", *a), 1,
           "max_starts_per_key")
    failed(await cli("queue", "pause", "no spaces", *a), 1, "queue")
