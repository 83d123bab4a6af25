"""The dev stack's replicated store shards never get a port of shard-0's Patroni members:
each cluster picks free ports on its own before any listens, so a port just picked for
shard-0 may be picked again for shard-1 (then one member cannot bind and the stack fails)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from chronoq.devstack import DevStack, DevStackSettings
from chronoq.embedded.ha import PatroniCluster


class FakeEtcd:
    endpoints = ["127.0.0.1:2379"]

    def patroni_auth(self) -> tuple[str, Path]:
        return ("patroni", Path("/nonexistent"))


def test_shard_members_never_reuse_shard0_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh: Iterator[int] = itertools.count(20_000)
    picks: list[list[int]] = []

    def free_ports(hosts: Sequence[str]) -> list[int]:
        # The second pick (shard-1's first try) hands out shard-0's ports again, as the
        # kernel may once they are released.
        ports = picks[0] if len(picks) == 1 else [next(fresh) for _ in hosts]
        picks.append(ports)
        return ports

    monkeypatch.setattr("chronoq.embedded.ha.cluster.free_ports", free_ports)
    settings = DevStackSettings(data_dir=tmp_path, port=0, pg_members=3, store_shards=2)
    dev = DevStack(settings)
    etcd: Any = FakeEtcd()
    dev.ha = PatroniCluster(tmp_path / "postgres-ha", etcd.endpoints, members=3)
    shards = dev._make_shards(etcd)

    shard0 = {p for a in dev.ha.addresses for p in (a.pg_port, a.api_port)}
    (server,) = shards.servers
    assert server.ha is not None
    shard1 = {p for a in server.ha.addresses for p in (a.pg_port, a.api_port)}
    assert len(picks) == 3  # the clashing pick was refused and made again
    assert not shard0 & shard1
