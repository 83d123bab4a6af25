"""The embedded etcd lets in only the clients that hold its generated credentials: no web page
(CORS, Host check), no local account without the password, and nobody outside its prefix."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aetcd
import pytest

from chronoq.coordinator.credentials import read_password
from chronoq.coordinator.etcd import Keys, connect, translated
from chronoq.embedded.etcd import USERS, EmbeddedEtcd, EmbeddedEtcdError
from chronoq.embedded.ha.config import NAMESPACE as PATRONI_NAMESPACE
from chronoq.embedded.pg_account import run_as
from chronoq.errors import ConfigError, CoordinatorUnavailable

pytestmark = pytest.mark.timeout(90)

EVIL = "http://evil.example"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _http(
    etcd: EmbeddedEtcd, method: str, path: str, body: dict[str, Any] | None, host: str
) -> tuple[int, str | None, bytes]:
    """What a browser's request from another origin gets: status, CORS header, body.

    text/plain needs no preflight: a page may send such a POST to any address, loopback too.
    """
    conn = http.client.HTTPConnection("127.0.0.1", etcd.members[0].client_port, timeout=5)
    try:
        headers = {"Origin": EVIL, "Host": host, "Content-Type": "text/plain"}
        if method == "OPTIONS":
            headers["Access-Control-Request-Method"] = "POST"
        conn.request(method, path, body=json.dumps(body) if body else None, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Access-Control-Allow-Origin"), response.read()
    finally:
        conn.close()


async def _owner_key_and_clock(etcd: EmbeddedEtcd, cluster: str) -> tuple[bytes, bytes]:
    keys = Keys(cluster)
    client = connect(etcd.client_settings(cluster))
    try:
        with translated("seed"):
            await client.put(keys.owner(0), b"node-a")
            await client.put(keys.clock, b"1000")
    finally:
        await client.close()
    return keys.owner(0), keys.clock


async def _values(etcd: EmbeddedEtcd, cluster: str, *keys: bytes) -> list[bytes | None]:
    client = connect(etcd.client_settings(cluster))
    try:
        with translated("read"):
            return [(got.value if (got := await client.get(k)) else None) for k in keys]
    finally:
        await client.close()


async def test_a_page_of_another_origin_reads_and_writes_nothing(
    etcd: EmbeddedEtcd, cluster_name: str
) -> None:
    owner, clock = await _owner_key_and_clock(etcd, cluster_name)
    attempts: list[tuple[str, str, dict[str, Any] | None]] = [
        ("POST", "/v3/kv/range", {"key": _b64("/"), "range_end": _b64("0")}),
        ("POST", "/v3/kv/put", {"key": _b64(clock.decode()), "value": _b64("86401000")}),
        ("POST", "/v3/kv/put", {"key": _b64(owner.decode()), "value": _b64("evil")}),
        ("POST", "/v3/kv/put", {"key": _b64(f"{PATRONI_NAMESPACE}x/config"), "value": _b64("{}")}),
        ("OPTIONS", "/v3/kv/range", None),
        ("GET", "/metrics", None),
    ]
    for host in ("evil.example", f"127.0.0.1:{etcd.members[0].client_port}"):
        for method, path, body in attempts:
            status, allow_origin, answer = _http(etcd, method, path, body, host)
            assert allow_origin is None, (host, path, allow_origin)  # the browser hides it
            if host == "evil.example":  # a name rebound to loopback: refused whatever it asks
                assert status == 421, (path, status, answer[:200])
            elif method == "POST":  # no token: refused before any key is touched
                assert status in (400, 401), (path, status, answer[:200])
                assert b"user name is empty" in answer
    assert await _values(etcd, cluster_name, owner, clock) == [b"node-a", b"1000"]


async def test_a_client_without_the_password_cannot_write_an_owner_key(
    etcd: EmbeddedEtcd, cluster_name: str
) -> None:
    owner, _ = await _owner_key_and_clock(etcd, cluster_name)
    host, port = etcd.endpoints[0].rsplit(":", 1)
    anonymous = aetcd.Client(host=host, port=int(port), timeout=2)
    try:
        with pytest.raises(aetcd.ClientError, match="user name is empty"):
            await anonymous.put(owner, b"evil")
        with pytest.raises(aetcd.ClientError, match="user name is empty"):
            await anonymous.get(owner)
    finally:
        await anonymous.close()
    wrong = replace(etcd.client_settings(cluster_name), password_file=None, password="guess")
    with pytest.raises(CoordinatorUnavailable, match="etcd refused user 'chronoq'"):
        client = connect(wrong)
        try:
            with translated("put"):
                await client.put(owner, b"evil")
        finally:
            await client.close()
    assert await _values(etcd, cluster_name, owner) == [b"node-a"]


async def test_each_user_reaches_only_its_own_prefix(
    etcd: EmbeddedEtcd, cluster_name: str
) -> None:
    owner, _ = await _owner_key_and_clock(etcd, cluster_name)
    chronoq = connect(etcd.client_settings(cluster_name))
    patroni = connect(etcd.client_settings(cluster_name, user="patroni"))
    try:
        with pytest.raises(aetcd.ClientError, match="permission denied"):
            await chronoq.put(f"{PATRONI_NAMESPACE}x/config".encode(), b"{}")
        with pytest.raises(aetcd.ClientError, match="permission denied"):
            await patroni.put(owner, b"evil")
        await patroni.put(f"{PATRONI_NAMESPACE}{cluster_name}".encode(), b"ok")  # its own
    finally:
        await chronoq.close()
        await patroni.close()


def test_the_passwords_are_private_to_their_owner(etcd: EmbeddedEtcd) -> None:
    directory = etcd.password_file().parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for user in USERS:
        st = etcd.password_file(user).stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, os.geteuid())
        assert len(etcd.password(user)) >= 32


_PROBE = r"""
import http.client, json, sys
try:
    open(sys.argv[1]).read()
    print("read the password")
except PermissionError:
    print("no read")
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[2]), timeout=5)
body = {"key": sys.argv[3], "value": "ZXZpbA=="}
conn.request("POST", "/v3/kv/put", body=json.dumps(body), headers={"Content-Type": "text/plain"})
answer = conn.getresponse()
print(answer.status, json.loads(answer.read()).get("message"))
"""


async def test_another_local_account_gets_neither_password_nor_key(
    etcd: EmbeddedEtcd, cluster_name: str
) -> None:
    """As the account the embedded PostgreSQL runs as: a real other uid on this machine."""
    other = run_as()
    if other is None:
        pytest.skip("needs root to act as another account")
    owner, _ = await _owner_key_and_clock(etcd, cluster_name)
    probe = await asyncio.to_thread(
        subprocess.run,
        ["/usr/bin/python3", "-c", _PROBE, str(etcd.password_file()),
         str(etcd.members[0].client_port), _b64(owner.decode())],
        user=other.pw_uid, group=other.pw_gid, extra_groups=[], capture_output=True, text=True,
        timeout=30, check=True, cwd="/", env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert probe.stdout.splitlines() == ["no read", "400 etcdserver: user name is empty"]
    assert await _values(etcd, cluster_name, owner) == [b"node-a"]


@pytest.mark.parametrize(
    ("mode", "dir_mode", "message"),
    [
        (0o644, 0o700, "open to group or others .* chmod 600"),
        (0o620, 0o700, "writable by group or others .* chmod 600"),
        (0o600, 0o777, "group or others may write .* chmod go-w"),
    ],
)
def test_a_password_file_others_could_read_or_replace_is_refused(
    tmp_path: Path, mode: int, dir_mode: int, message: str
) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir()
    path = directory / "etcd"
    path.write_text("a-password\n")
    path.chmod(mode)
    directory.chmod(dir_mode)
    with pytest.raises(ConfigError, match=message):
        read_password(path)
    path.chmod(0o600)
    directory.chmod(0o700)
    assert read_password(path) == "a-password"


def test_a_password_file_of_another_account_is_refused(tmp_path: Path) -> None:
    other = run_as()
    if other is None:
        pytest.skip("needs root to give a file to another account")
    path = tmp_path / "etcd"
    path.write_text("a-password\n")
    path.chmod(0o600)
    os.chown(path, other.pw_uid, other.pw_gid)
    with pytest.raises(ConfigError, match=f"belongs to uid {other.pw_uid}"):
        read_password(path)


@pytest.fixture
def tampered(tmp_path: Path) -> Iterator[Path]:
    """An etcd data directory in which someone added a user before auth was on."""
    data = tmp_path / "etcd"
    open_etcd = EmbeddedEtcd(data, durable=False, auth=False)
    open_etcd.start()
    try:
        port = open_etcd.members[0].client_port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/v3/auth/user/add", body=json.dumps({"name": "evil", "password": "x"}))
        assert conn.getresponse().status == 200
    finally:
        open_etcd.stop()
    yield data


def test_an_etcd_changed_before_its_auth_was_on_is_refused(tampered: Path) -> None:
    changed = EmbeddedEtcd(tampered, durable=False)
    with pytest.raises(EmbeddedEtcdError, match=r"changed by someone else .*evil"):
        changed.start()
    assert changed.members[0].pid is None  # stopped again


async def test_a_node_process_joins_with_a_password_file(
    etcd: EmbeddedEtcd, dsn: str, cluster_name: str, tmp_path: Path
) -> None:
    """``chronoq node`` against an etcd with auth, the password from a file: it joins; with
    the same file open to others it refuses to start, in one line."""
    args = [sys.executable, "-m", "chronoq.cli", "node", "--dsn", dsn, "--port", "0",
            "--partitions", "4", "--node-id", "pw-node", "--etcd", ",".join(etcd.endpoints),
            "--cluster", cluster_name]  # fmt: skip
    exposed = tmp_path / "exposed"
    exposed.write_text(etcd.password() + "\n")
    exposed.chmod(0o644)
    refused = await asyncio.to_thread(
        subprocess.run,
        [*args, "--etcd-user", "chronoq", "--etcd-password-file", str(exposed)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "chmod 600" in refused.stderr and "Traceback" not in refused.stderr
    node = await asyncio.create_subprocess_exec(
        *args, *etcd.node_args(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert node.stdout is not None
        line = (await asyncio.wait_for(node.stdout.readline(), 30)).decode()
        assert re.search(r"serving on \S+", line), line
        member = Keys(cluster_name).member("pw-node")
        assert (await _values(etcd, cluster_name, member))[0] is not None
    finally:
        node.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(node.communicate(), 20)
    assert node.returncode == 0, stderr.decode()
