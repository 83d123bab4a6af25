"""How etcd endpoints become one gRPC target."""

from __future__ import annotations

import pytest


def test_etcd_endpoints_with_names_resolve_to_an_ipv4_target() -> None:
    from chronoq.coordinator.etcd import _target
    from chronoq.errors import ConfigError

    assert _target(["localhost:2379"]) == ("localhost", 2379)
    assert _target(["localhost:1", "127.0.0.1:2"]) == ("ipv4:127.0.0.1:1,127.0.0.1", 2)
    with pytest.raises(ConfigError, match="is not host:port"):
        _target(["nohost"])
