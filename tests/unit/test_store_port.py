"""The node's parts speak the store port (``chronoq.store.port``), not the PostgreSQL store.

Only the node itself builds the concrete ``Store`` (and the ``Schedules`` beside it); every
other part takes the narrowest port it uses, so a store of several shards is one more
implementation of the port and nothing in the node changes. mypy checks that the
PostgreSQL store satisfies the port; this checks that no part reaches past it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from chronoq.store import port
from chronoq.store.schedules import Schedules
from chronoq.store.store import Store

NODE = Path(__file__).resolve().parents[2] / "chronoq" / "node"
#: Parts that may name the concrete store: the node, which builds it (``node_shards`` opens
#: a store per shard of its map), and the shard admin, which opens a database given to
#: ``AddShard`` (and the mover's own pools on the shards).
BUILDERS = {"node.py", "node_shards.py", "shard_admin.py"}
CONCRETE = {"Store", "Schedules"}
#: Public calls of the PostgreSQL store that are its own, not the port's: how it is built
#: (``connect``, ``migrate``), its raw connections (``Schedules``, tools and tests use
#: them), a helper of its fail statement, the token calls a store of shards makes on the
#: shard holding queue limits for a claim on another shard, and the read of a shard's ready
#: heads that decides how many each shard's claim takes, and what a node asks of shard-0
#: before the first map (whether it is empty, then adopting its part of that map).
OWN = {
    "connect",
    "migrate",
    "holds_no_rows",
    "adopt",
    "connection",
    "after_failure",
    "take_tokens",
    "return_tokens",
    "ready_heads",
    # the parts of a resume a store of shards runs on every shard (misfire pass, settings
    # row, ready count) before it answers the port's resume_queue
    "skip_overdue_ready",
    "unpause_queue",
    "ready_count",
    "copy_queue_settings",  # AddShard: a joining shard takes the first shard's settings
    "pause_once",  # Schedules: a store of shards releases a paused rate once
    "remove",  # Schedules: a store of shards gives back what the deleted one held
    "bulk_batch",  # one statement of a bulk walk: a store of shards runs it on every shard
}


def _concrete_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("chronoq.store"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in CONCRETE]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "chronoq.store.store"]
    return found


def test_only_the_node_names_the_concrete_store() -> None:
    offenders = {
        path.name: names
        for path in sorted(NODE.rglob("*.py"))
        if path.name not in BUILDERS and (names := _concrete_imports(path))
    }
    assert offenders == {}


def test_the_check_sees_a_concrete_import(tmp_path: Path) -> None:
    part = tmp_path / "part.py"
    part.write_text("from chronoq.store import FireResult, Store\nimport chronoq.store.store\n")
    assert _concrete_imports(part) == ["chronoq.store.Store", "chronoq.store.store"]


def _port_members(*protocols: type) -> set[str]:
    return {
        name
        for proto in protocols
        for cls in proto.__mro__
        if cls.__module__ == port.__name__
        for name in vars(cls)
        if not name.startswith("_")
    }


def _outside_port(impl: type, *protocols: type) -> set[str]:
    public = {n for n in dir(impl) if not n.startswith("_") and callable(getattr(impl, n))}
    return public - _port_members(*protocols) - OWN


def test_every_call_of_the_store_is_in_a_port() -> None:
    """A new statement of the store has to be placed in the port (by how it routes), or a
    store of shards would not have it."""
    assert _outside_port(Store, port.TaskStore) == set()
    assert _outside_port(Schedules, port.ScheduleAdmin, port.ScheduleOwner) == set()


def test_a_statement_left_out_of_the_port_is_seen() -> None:
    class Grown(Store):
        async def new_statement(self) -> None: ...

    assert _outside_port(Grown, port.TaskStore) == {"new_statement"}
