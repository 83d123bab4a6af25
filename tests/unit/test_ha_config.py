"""The replicated store's pure parts: member addresses, Patroni's configuration, the DSN,
reading roles, and the words that tell a client a store outage left an outcome unknown."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.client.client import STORE_OUTAGE_MARK
from chronoq.embedded.ha.config import (
    LOOP_WAIT_S,
    MAX_MEMBERS,
    MIN_MEMBERS,
    RESTAPI_USER,
    RETRY_TIMEOUT_S,
    TTL_S,
    member_addresses,
    member_config,
    multi_host_dsn,
    topology,
)
from chronoq.store.connection import UNKNOWN_OUTCOME, _unconfirmed


def _addresses(n: int) -> Any:
    return member_addresses(n, list(range(20000, 20000 + 2 * n)))


@given(st.integers(MIN_MEMBERS, MAX_MEMBERS), st.text(min_size=1, max_size=40))
def test_dsn_names_every_member_and_asks_for_the_primary(n: int, password: str) -> None:
    members = _addresses(n)
    dsn = multi_host_dsn(members, password, "chron oq")
    parts = urlsplit(dsn)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    assert unquote(userinfo.partition(":")[2]) == password
    assert hosts.split(",") == [f"{m.host}:{m.pg_port}" for m in members]
    assert unquote(parts.path) == "/chron oq"
    assert parse_qs(parts.query) == {"target_session_attrs": ["read-write"]}


def test_members_get_loopback_addresses_other_than_127_0_0_1() -> None:
    members = _addresses(MAX_MEMBERS)
    hosts = [m.host for m in members]
    assert len(set(hosts)) == MAX_MEMBERS and "127.0.0.1" not in hosts
    assert all(h.startswith("127.") for h in hosts)


@pytest.mark.parametrize("n", [0, 1, MAX_MEMBERS + 1])
def test_member_count_is_bounded(n: int) -> None:
    with pytest.raises(ValueError, match="members must be"):
        _addresses(n) if n > 0 else member_addresses(n, [])


def test_config_is_synchronous_strict_failsafe_and_within_patronis_rules() -> None:
    [member] = _addresses(2)[:1]
    config = member_config(
        scope="s", member=member, etcd_hosts=["127.0.0.1:2379"], data_dir="/d", bin_dir="/b",
        socket_dir="/s", pgpass="/p", superuser_password="x", replication_password="y",
        restapi_password="z",
    )  # fmt: skip
    dcs = config["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] and dcs["synchronous_mode_strict"] and dcs["failsafe_mode"]
    assert dcs["ttl"] >= 20 and LOOP_WAIT_S + 2 * RETRY_TIMEOUT_S <= TTL_S
    assert config["postgresql"]["connect_address"] == f"{member.host}:{member.pg_port}"
    assert config["restapi"]["connect_address"] == f"{member.host}:{member.api_port}"
    assert "fsync" not in config["postgresql"]["parameters"]  # durable by default
    assert all("trust" not in line for line in config["postgresql"]["pg_hba"])
    # Unsafe REST calls want a password; the API listens on the member's loopback address.
    assert config["restapi"]["authentication"] == {"username": RESTAPI_USER, "password": "z"}
    assert config["restapi"]["listen"].startswith("127.")


def test_roles_are_read_from_patronis_cluster_answer() -> None:
    answer = {
        "members": [
            {"name": "pg0", "role": "sync_standby", "state": "streaming"},
            {"name": "pg1", "role": "leader", "state": "running"},
            {"name": "pg2", "role": "replica", "state": "streaming"},
        ]
    }
    seen = topology(answer)
    assert seen.leader == "pg1" and seen.sync_standbys == ("pg0",)
    assert seen.ready(3) and seen.writable()
    answer["members"][2]["state"] = "starting"
    assert not topology(answer).ready(3) and topology(answer).writable()
    answer["members"][0]["role"] = "replica"
    assert not topology(answer).writable()  # strict mode: no standby, no acknowledged commit
    assert topology({"members": []}).leader is None


def test_a_store_outage_tells_the_client_to_retry() -> None:
    assert STORE_OUTAGE_MARK in UNKNOWN_OUTCOME


def test_a_cancelled_wait_for_the_standby_is_recognised() -> None:
    cancelled = SimpleNamespace(
        message="canceling wait for synchronous replication due to user request"
    )
    assert _unconfirmed(cancelled)
    assert not _unconfirmed(SimpleNamespace(message="there is no transaction in progress"))


def test_all_faults_has_the_store_faults_only_with_a_replicated_store() -> None:
    from chronoq.chaos.fault_plan import STORE_HA_KINDS, FaultKind, parse_kinds

    single = parse_kinds("all")
    assert not set(single) & set(STORE_HA_KINDS)
    assert FaultKind.RESTART_POSTGRES in single
    replicated = parse_kinds("all", replicated=True)
    assert set(STORE_HA_KINDS) <= set(replicated)
    assert FaultKind.RESTART_POSTGRES not in replicated  # it needs a single server
    assert parse_kinds("switchover,kill-pg-member") == [
        FaultKind.SWITCHOVER,
        FaultKind.KILL_PG_MEMBER,
    ]
