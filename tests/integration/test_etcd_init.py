"""``chronoq etcd init`` (docker-compose's ``etcd-init``) on a real etcd started without auth:
it turns auth on with the passwords of the environment, a second run changes nothing, each
user reaches only its own prefix, and an etcd someone changed before is refused."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aetcd
import pytest
import yaml

from chronoq.coordinator.etcd import connect
from chronoq.coordinator.settings import EtcdSettings
from chronoq.embedded.etcd import EmbeddedEtcd, EmbeddedEtcdError
from chronoq.embedded.etcd_auth import (
    ChangedBeforeAuth,
    Gateway,
    GatewayUnreachable,
    authenticate,
    init_auth,
)
from chronoq.embedded.ha.config import NAMESPACE as PATRONI_NAMESPACE

pytestmark = pytest.mark.timeout(120)

PASSWORDS = {"root": "root-secret-1", "chronoq": "chronoq-secret-1", "patroni": "patroni-secret-1"}
VARIABLES = {
    "root": "CHRONOQ_ETCD_ROOT_PASSWORD",
    "chronoq": "CHRONOQ_ETCD_PASSWORD",
    "patroni": "CHRONOQ_ETCD_PATRONI_PASSWORD",
}


@pytest.fixture
def open_etcd(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    """A new etcd with auth off, as docker-compose's members start."""
    server = EmbeddedEtcd(tmp_path / "etcd", durable=False, auth=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _init(passwords: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``chronoq etcd init`` as compose runs it: endpoints in argv, passwords in the env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")}
    env |= {VARIABLES[user]: password for user, password in passwords.items()}
    return subprocess.run(
        [sys.executable, "-m", "chronoq.cli", "etcd", "init", "--etcd", *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def _gateway(etcd: EmbeddedEtcd) -> Gateway:
    return Gateway(etcd.client_urls[0])


def _auth_revision(etcd: EmbeddedEtcd) -> int:
    token = authenticate(_gateway(etcd), "root", PASSWORDS["root"])
    status = _gateway(etcd)("/v3/auth/status", {}, token)
    assert status.get("enabled") is True
    return int(status["authRevision"])


def _client(etcd: EmbeddedEtcd, user: str, password: str) -> aetcd.Client:
    settings = EtcdSettings(endpoints=etcd.endpoints, username=user, password=password)
    return connect(settings)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _post(etcd: EmbeddedEtcd, path: str, body: dict[str, Any]) -> int:
    """An anonymous gateway call, as anyone who reaches the port makes it."""
    conn = http.client.HTTPConnection("127.0.0.1", etcd.members[0].client_port, timeout=5)
    try:
        conn.request("POST", path, body=json.dumps(body))
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


async def test_init_turns_auth_on_and_a_second_run_changes_nothing(
    open_etcd: EmbeddedEtcd,
) -> None:
    # A member that is down comes first: init uses the one that is healthy.
    endpoints = f"127.0.0.1:1,{open_etcd.endpoints[0]}"
    first = await asyncio.to_thread(_init, PASSWORDS, endpoints)
    assert first.returncode == 0, first.stderr
    assert "turned auth on" in first.stdout
    assert not any(p in first.stdout + first.stderr for p in PASSWORDS.values())
    anonymous = aetcd.Client(host="127.0.0.1", port=open_etcd.members[0].client_port, timeout=2)
    try:
        with pytest.raises(aetcd.ClientError, match="user name is empty"):
            await anonymous.put(b"/chronoq/prod/owners/00000", b"evil")
    finally:
        await anonymous.close()
    assert _post(open_etcd, "/v3/auth/user/add", {"name": "evil", "password": "x"}) != 200
    revision = _auth_revision(open_etcd)
    again = await asyncio.to_thread(_init, PASSWORDS, endpoints)
    assert again.returncode == 0, again.stderr
    assert "auth was on already" in again.stdout
    assert _auth_revision(open_etcd) == revision  # nothing written: no token of anyone ended


async def test_each_user_reaches_only_its_prefix(open_etcd: EmbeddedEtcd) -> None:
    init_auth(open_etcd.endpoints, PASSWORDS, wait=10)
    chronoq = _client(open_etcd, "chronoq", PASSWORDS["chronoq"])
    patroni = _client(open_etcd, "patroni", PASSWORDS["patroni"])
    try:
        await chronoq.put(b"/chronoq/prod/owners/00000", b"node-1")
        await patroni.put(f"{PATRONI_NAMESPACE}chronoq/leader".encode(), b"db-1")
        with pytest.raises(aetcd.ClientError, match="permission denied"):
            await chronoq.put(f"{PATRONI_NAMESPACE}chronoq/config".encode(), b"{}")
        with pytest.raises(aetcd.ClientError, match="permission denied"):
            await chronoq.get(f"{PATRONI_NAMESPACE}chronoq/leader".encode())
        with pytest.raises(aetcd.ClientError, match="permission denied"):
            await patroni.put(b"/chronoq/prod/owners/00000", b"evil")
        with pytest.raises(aetcd.ClientError, match="permission denied"):
            await chronoq.put(b"/elsewhere", b"x")
        # Neither may change users or roles: that is root's.
        token = authenticate(_gateway(open_etcd), "chronoq", PASSWORDS["chronoq"])
        with pytest.raises(Exception, match="permission denied"):
            _gateway(open_etcd)("/v3/auth/user/add", {"name": "evil", "password": "x"}, token)
        assert (await chronoq.get(b"/chronoq/prod/owners/00000")).value == b"node-1"
    finally:
        await chronoq.close()
        await patroni.close()


def test_a_changed_password_reaches_its_user_and_the_old_one_stops_working(
    open_etcd: EmbeddedEtcd,
) -> None:
    init_auth(open_etcd.endpoints, PASSWORDS, wait=10)
    rotated = {**PASSWORDS, "chronoq": "chronoq-secret-2"}
    result = _init(rotated, open_etcd.endpoints[0])
    assert result.returncode == 0, result.stderr
    assert "new password for chronoq" in result.stdout
    authenticate(_gateway(open_etcd), "chronoq", "chronoq-secret-2")
    authenticate(_gateway(open_etcd), "patroni", PASSWORDS["patroni"])  # untouched
    with pytest.raises(Exception, match="authentication failed"):
        authenticate(_gateway(open_etcd), "chronoq", PASSWORDS["chronoq"])


def test_another_root_password_is_refused_in_one_line(open_etcd: EmbeddedEtcd) -> None:
    init_auth(open_etcd.endpoints, PASSWORDS, wait=10)
    result = _init({**PASSWORDS, "root": "a-guess"}, open_etcd.endpoints[0])
    assert result.returncode == 1
    assert "refuses CHRONOQ_ETCD_ROOT_PASSWORD" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ("user", r"users \['chronoq', 'evil', 'patroni', 'root'\]"),
        ("root-role", r"evil.*roles \['root'\]"),
        ("patroni-config", "1 keys in a new etcd"),
    ],
)
def test_an_etcd_changed_before_init_is_refused(
    open_etcd: EmbeddedEtcd, change: str, found: str
) -> None:
    """Before auth is on anyone may write: a user of their own (made root, even), or Patroni's
    configuration (archive_command runs as the PostgreSQL account). init refuses it."""
    if change in ("user", "root-role"):
        assert _post(open_etcd, "/v3/auth/user/add", {"name": "evil", "password": "x"}) == 200
    if change == "root-role":
        assert _post(open_etcd, "/v3/auth/user/grant", {"user": "evil", "role": "root"}) == 200
    if change == "patroni-config":
        key = _b64(f"{PATRONI_NAMESPACE}chronoq/config")
        value = _b64('{"postgresql": {"parameters": {"archive_command": "id"}}}')
        assert _post(open_etcd, "/v3/kv/put", {"key": key, "value": value}) == 200
    with pytest.raises(ChangedBeforeAuth, match=found):
        init_auth(open_etcd.endpoints, PASSWORDS, wait=10)
    # Auth is on now, so nobody else changes anything more; and no later run takes the etcd
    # as it is (compose runs init on every `up`).
    assert _post(open_etcd, "/v3/kv/put", {"key": _b64("/x"), "value": _b64("y")}) != 200
    again = _init(PASSWORDS, open_etcd.endpoints[0], "--adopt-keys")
    assert again.returncode == 1
    assert "changed by someone else before its auth was on" in again.stderr
    assert "Traceback" not in again.stderr


def test_an_embedded_etcd_changed_before_its_auth_stays_refused(tmp_path: Path) -> None:
    """The embedded etcd shares the procedure: its second start is refused like its first."""
    data = tmp_path / "etcd"
    with EmbeddedEtcd(data, durable=False, auth=False) as before:
        assert _post(before, "/v3/auth/user/add", {"name": "evil", "password": "x"}) == 200
    for _ in range(2):
        changed = EmbeddedEtcd(data, durable=False)
        with pytest.raises(EmbeddedEtcdError, match="changed by someone else"):
            changed.start()
        assert changed.members[0].pid is None


def test_keys_of_a_deployment_from_before_auth_are_adopted_when_asked(
    open_etcd: EmbeddedEtcd,
) -> None:
    key = _b64("/chronoq/prod/owners/00000")
    assert _post(open_etcd, "/v3/kv/put", {"key": key, "value": _b64("node-1")}) == 200
    refused = _init(PASSWORDS, open_etcd.endpoints[0])
    assert refused.returncode == 1
    assert (
        "1 keys in a new etcd" in refused.stderr and "CHRONOQ_ETCD_ADOPT_KEYS=1" in refused.stderr
    )
    assert "Traceback" not in refused.stderr


def test_missing_passwords_and_no_healthy_member_are_one_line(tmp_path: Path) -> None:
    missing = subprocess.run(
        [sys.executable, "-m", "chronoq.cli", "etcd", "init", "--etcd", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")},
    )  # fmt: skip
    assert missing.returncode == 2
    assert "set CHRONOQ_ETCD_ROOT_PASSWORD, CHRONOQ_ETCD_PASSWORD" in missing.stderr
    with pytest.raises(GatewayUnreachable, match=r"no etcd member of 127\.0\.0\.1:1 healthy"):
        init_auth(["127.0.0.1:1"], PASSWORDS, wait=0.5)


# ------------------------------------------------------------ docker-compose's etcd, run here

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def compose_etcd(tmp_path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """etcd-1 of docker-compose.yml on this machine's etcd binary: its flags as written but
    for the addresses (loopback ports) and the data directory; and its service definition."""
    from chronoq.embedded.etcd import ETCD_BINARY

    service = yaml.safe_load(COMPOSE.read_text())["services"]["etcd-1"]
    client, peer = _free_port(), _free_port()
    local = {
        "--data-dir": str(tmp_path / "etcd-1"),
        "--listen-client-urls": f"http://127.0.0.1:{client}",
        "--advertise-client-urls": f"http://127.0.0.1:{client}",
        "--listen-peer-urls": f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls": f"http://127.0.0.1:{peer}",
        "--initial-cluster": f"etcd-1=http://127.0.0.1:{peer}",
    }
    args = [str(ETCD_BINARY)]
    for arg in service["command"][1:]:
        name, _, value = str(arg).partition("=")
        args.append(f"{name}={local.get(name, value)}")
    assert "--cors=http://etcd-1:2379" in args and any("host-whitelist" in a for a in args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    with (tmp_path / "etcd-1.log").open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        gateway = Gateway(f"http://127.0.0.1:{client}")
        for _ in range(200):
            if gateway.healthy(timeout=0.5):
                break
            assert process.poll() is None, (tmp_path / "etcd-1.log").read_text()[-2000:]
            time.sleep(0.05)
        yield client, service
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _compose_health_check(client: int, service: dict[str, Any], password: str) -> int:
    """The member's health check as compose runs it (its argv and environment)."""
    from chronoq.embedded.etcd import ETCDCTL_BINARY

    test = [str(t) for t in service["healthcheck"]["test"][1:]]
    test[0] = str(ETCDCTL_BINARY)
    test = [t.replace("127.0.0.1:2379", f"127.0.0.1:{client}") for t in test]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    env |= {k: password if "PASSWORD" in k else str(v) for k, v in service["environment"].items()}
    return subprocess.run(test, capture_output=True, timeout=30, check=False, env=env).returncode


def _gateway_as_a_page(client: int, host: str) -> tuple[int, str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", client, timeout=5)
    try:
        headers = {"Origin": "http://evil.example", "Host": host, "Content-Type": "text/plain"}
        body = json.dumps({"key": _b64(f"{PATRONI_NAMESPACE}chronoq/config"), "value": _b64("{}")})
        conn.request("POST", "/v3/kv/put", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("Access-Control-Allow-Origin")
    finally:
        conn.close()


def test_the_compose_etcd_is_healthy_before_and_after_init_and_refuses_pages(
    compose_etcd: tuple[int, dict[str, Any]],
) -> None:
    """The members' health check passes before etcd-init (auth off) and after it (auth on, as
    the user chronoq); then a page of another origin, by any Host, neither writes nor reads."""
    client, service = compose_etcd
    assert _compose_health_check(client, service, PASSWORDS["chronoq"]) == 0
    assert _gateway_as_a_page(client, "evil.example")[0] == 421  # a rebound name
    result = _init(PASSWORDS, f"127.0.0.1:{client}")
    assert result.returncode == 0, result.stderr
    assert _compose_health_check(client, service, PASSWORDS["chronoq"]) == 0
    assert _compose_health_check(client, service, "a-guess") != 0  # the login is real
    for host in ("evil.example", f"localhost:{client}", f"127.0.0.1:{client}", "etcd-1:2379"):
        status, allow_origin = _gateway_as_a_page(client, host)
        assert allow_origin is None, host  # the browser hides any answer
        assert status in (400, 401, 421), (host, status)  # no token: refused
