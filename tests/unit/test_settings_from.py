"""A node's settings from operator options: unset options take the library's defaults."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from chronoq.config import NodeSettings
from chronoq.coordinator.ttl import DEFAULT_LEASE_TTL
from chronoq.errors import ConfigError
from chronoq.node.settings_from import NodeOptions, settings_from, shown_defaults


def test_unset_options_take_the_library_defaults() -> None:
    got = settings_from(NodeOptions(dsn="postgresql://db/chronoq"))
    want = NodeSettings(dsn="postgresql://db/chronoq", node_id=got.node_id)
    assert got == want


def test_operator_units_and_zero_as_off() -> None:
    got = settings_from(
        NodeOptions(
            dsn="x",
            tick_ms=50,
            horizon_days=10,
            retention_days=0,
            dead_retention_days=1.5,
            max_clock_offset_ms=0,
            submit_quota=0,
            ready_notices=False,
            long_polls_per_node=7,
        )
    )
    assert got.tick == timedelta(milliseconds=50)
    assert got.limits.horizon == timedelta(days=10)
    assert got.retention is None and got.dead_retention == timedelta(hours=36)
    assert got.max_clock_offset is None and got.submit_quota is None
    assert got.ready_notices is False and got.long_polls_per_node == 7


def test_cluster_options() -> None:
    got = settings_from(NodeOptions(dsn="x", etcd="a:2379, b:2379", etcd_user="u"))
    assert got.cluster is not None
    assert list(got.cluster.etcd.endpoints) == ["a:2379", "b:2379"]
    assert got.cluster.lease_ttl == DEFAULT_LEASE_TTL and got.cluster.etcd.username == "u"
    with pytest.raises(ConfigError, match="lease TTL"):
        settings_from(NodeOptions(dsn="x", etcd="a:2379", lease_ttl=1))
    with pytest.raises(ConfigError, match="need --etcd"):
        settings_from(NodeOptions(dsn="x", etcd_ca="ca.pem"))


def test_an_etcd_password_file_is_checked_when_the_settings_are_made(tmp_path: Path) -> None:
    path = tmp_path / "etcd-password"
    path.write_text("s3cret\n")
    path.chmod(0o600)
    options = NodeOptions(dsn="x", etcd="a:2379", etcd_user="u", etcd_password_file=str(path))
    got = settings_from(options)
    assert got.cluster is not None and got.cluster.etcd.password_file == str(path)
    assert got.cluster.etcd.password is None  # read at connect, never kept in the settings
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        settings_from(options)
    with pytest.raises(ConfigError, match="need --etcd"):
        settings_from(NodeOptions(dsn="x", etcd_password_file=str(path)))


def test_shown_defaults_cover_the_unset_options() -> None:
    shown = shown_defaults()
    assert shown["tick_ms"] == 100 and shown["lease_ttl"] == DEFAULT_LEASE_TTL
    assert shown["horizon_days"] == 366 and shown["retention_days"] == 7
