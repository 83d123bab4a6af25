"""gRPC targets from address lists (names resolve through the system resolver: localhost)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.errors import ConfigError
from chronoq.targets import first_host, grpc_target, is_several, node_targets, split_addresses


def test_one_address_goes_as_given() -> None:
    assert grpc_target("node-a:7070") == "node-a:7070"  # not resolved: gRPC's dns resolver does
    assert grpc_target(["node-a:7070"]) == "node-a:7070"
    assert not is_several("node-a:7070")


def test_several_addresses_become_one_ipv4_target_with_names_resolved() -> None:
    target = grpc_target("localhost:7070, 127.0.0.1:7071,")
    assert target == "ipv4:127.0.0.1:7070,127.0.0.1:7071"
    assert is_several(target)
    assert first_host("localhost:7070,127.0.0.1:7071") == "localhost"


def test_grpc_syntax_passes_through() -> None:
    for target in ("dns:///chronoq:7070", "ipv4:10.0.0.1:1,10.0.0.2:2", "unix:/tmp/s.sock"):
        assert grpc_target(target) == target


@pytest.mark.parametrize(
    ("addresses", "message"),
    [
        ("", "at least one node address is needed"),
        (" , ", "at least one node address is needed"),
        ("a:1,nohost", "'nohost' is not host:port"),
        ("a:1,b:port", "'b:port' is not host:port"),
        ("a:1,b:70000", "'b:70000' is not host:port"),
        ("a:1,:5", "':5' is not host:port"),
        ("127.0.0.1:1,no-such-host.invalid:2", "cannot resolve 'no-such-host.invalid'"),
    ],
)
def test_bad_address_lists_say_which_address_is_wrong(addresses: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        grpc_target(addresses, what="node address")


@given(st.lists(st.integers(min_value=1, max_value=65535), min_size=2, max_size=8))
def test_every_port_survives_in_order(ports: list[int]) -> None:
    target = grpc_target([f"127.0.0.1:{p}" for p in ports])
    assert target.removeprefix("ipv4:").split(",") == [f"127.0.0.1:{p}" for p in ports]
    assert split_addresses(",".join(map(str, ports))) == [str(p) for p in ports]


def test_node_targets_give_one_channel_target_per_node() -> None:
    assert node_targets("node-a:7070") == ["node-a:7070"]
    assert node_targets("node-a:7070, node-b:7071,") == ["node-a:7070", "node-b:7071"]
    assert node_targets("ipv4:10.0.0.1:1,10.0.0.2:2") == ["ipv4:10.0.0.1:1", "ipv4:10.0.0.2:2"]
    assert node_targets("dns:///chronoq:7070") == ["dns:///chronoq:7070"]
    with pytest.raises(ConfigError, match="'b:port' is not host:port"):
        node_targets("a:1,b:port")
    with pytest.raises(ConfigError, match="at least one node address is needed"):
        node_targets(" , ")
