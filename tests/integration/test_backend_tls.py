"""TLS and credentials towards the backends: etcd (TLS, client certificates, user/password)
and PostgreSQL (TLS verified against a CA, password, plaintext refused), on real servers."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chronoq.config import NodeSettings
from chronoq.coordinator.etcd import ClusterSettings, EtcdSettings, connect, translated
from chronoq.coordinator.ownership import EtcdOwnership
from chronoq.embedded.etcd import ETCDCTL_BINARY, EmbeddedEtcd, EtcdServerTLS
from chronoq.embedded.pg_account import run_as as account_to_run_as
from chronoq.embedded.postgres import EmbeddedPostgres
from chronoq.errors import ConfigError, CoordinatorUnavailable, StoreUnavailable
from chronoq.node import Node
from chronoq.store import Store
from tests.integration.conftest import NodeFactory
from tests.integration.pki import Pki, make_pki

ETCD_USER, ETCD_PASSWORD = "chronoq", "etcd-pw-4711"
PG_USER, PG_PASSWORD = "app", "pg-pw-0815"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# ---------------------------------------------------------------------- etcd over TLS


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EmbeddedEtcd]:
    """etcd serving https and requiring client certificates of the test CA."""
    tls = EtcdServerTLS(pki.server_cert, pki.server_key, pki.ca, client_cert_auth=True)
    # Client certificates are the authentication here.
    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd-tls"), durable=False, tls=tls, auth=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _roundtrip(settings: EtcdSettings) -> bytes:
    client = connect(settings)
    try:
        with translated("roundtrip"):
            await client.put(b"/chronoq/tls-test", b"ok")
            got = await client.get(b"/chronoq/tls-test")
        return bytes(got.value)
    finally:
        await client.close()


async def test_etcd_over_mutual_tls(tls_etcd: EmbeddedEtcd, pki: Pki) -> None:
    endpoint = tls_etcd.endpoints[0]
    good = EtcdSettings(
        endpoints=[endpoint], ca_cert=str(pki.ca), cert_cert=str(pki.client_cert),
        cert_key=str(pki.client_key), timeout=2,
    )
    assert await _roundtrip(good) == b"ok"
    # Also as https://, the form etcd prints.
    assert await _roundtrip(dataclasses.replace(good, endpoints=[f"https://{endpoint}"])) == b"ok"
    # Several endpoints become one ipv4: target; certificates are checked against the first.
    assert await _roundtrip(dataclasses.replace(good, endpoints=[endpoint, endpoint])) == b"ok"

    refused = {
        "plaintext": EtcdSettings(endpoints=[endpoint], timeout=1),
        "no client certificate": EtcdSettings(endpoints=[endpoint], ca_cert=str(pki.ca), timeout=1),
        "another CA": EtcdSettings(
            endpoints=[endpoint], ca_cert=str(pki.other_ca), cert_cert=str(pki.client_cert),
            cert_key=str(pki.client_key), timeout=1,
        ),
        "a stranger's certificate": EtcdSettings(
            endpoints=[endpoint], ca_cert=str(pki.ca), cert_cert=str(pki.other_client_cert),
            cert_key=str(pki.other_client_key), timeout=1,
        ),
    }
    for case, settings in refused.items():
        with pytest.raises(CoordinatorUnavailable, match="etcd: roundtrip failed"):
            await _roundtrip(settings)
            pytest.fail(f"{case}: etcd answered")


async def test_etcd_tls_settings_are_checked(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="etcd_cert and etcd_key go together"):
        connect(EtcdSettings(endpoints=["127.0.0.1:2379"], cert_cert=str(pki.client_cert)))
    with pytest.raises(ConfigError, match="etcd_ca: cannot read"):
        connect(EtcdSettings(endpoints=["127.0.0.1:2379"], ca_cert=str(tmp_path / "none.pem")))
    with pytest.raises(ConfigError, match="username and password go together"):
        connect(EtcdSettings(endpoints=["127.0.0.1:2379"], username="u"))


async def test_a_node_joins_a_cluster_over_etcd_tls(
    make_node: NodeFactory, tls_etcd: EmbeddedEtcd, pki: Pki, cluster_name: str
) -> None:
    etcd = EtcdSettings(
        endpoints=tls_etcd.endpoints, cluster=cluster_name, ca_cert=str(pki.ca),
        cert_cert=str(pki.client_cert), cert_key=str(pki.client_key),
    )
    node = await make_node(cluster=ClusterSettings(etcd=etcd, lease_ttl=2))
    for _ in range(100):
        if node.ownership is not None and len(node.ownership.owned()) == 16:
            break
        await asyncio.sleep(0.05)
    assert node.ownership is not None and len(node.ownership.owned()) == 16


# ---------------------------------------------------------------------- etcd users


def _etcdctl(endpoint: str, *args: str, user: str | None = None) -> None:
    cmd = [str(ETCDCTL_BINARY), f"--endpoints={endpoint}", *args]
    if user:
        cmd.insert(2, f"--user={user}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    subprocess.run(cmd, check=True, capture_output=True, timeout=30, env=env)


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    """etcd with auth on: root, and a user ``chronoq`` who may read and write /chronoq/ only."""
    # An external etcd whose users the test makes itself, as an operator would.
    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd-auth"), durable=False, auth=False)
    server.start()
    try:
        endpoint = server.endpoints[0]
        _etcdctl(endpoint, "user", "add", "root:root-pw-1")
        _etcdctl(endpoint, "user", "grant-role", "root", "root")
        _etcdctl(endpoint, "role", "add", "chronoq")
        _etcdctl(endpoint, "role", "grant-permission", "chronoq", "--prefix=true", "readwrite",
                 "/chronoq/")
        _etcdctl(endpoint, "user", "add", f"{ETCD_USER}:{ETCD_PASSWORD}")
        _etcdctl(endpoint, "user", "grant-role", ETCD_USER, "chronoq")
        _etcdctl(endpoint, "auth", "enable")
        yield server
    finally:
        server.stop()


async def test_etcd_password(
    make_node: NodeFactory, auth_etcd: EmbeddedEtcd, dsn: str, cluster_name: str
) -> None:
    def etcd(**kwargs: Any) -> EtcdSettings:
        return EtcdSettings(endpoints=auth_etcd.endpoints, cluster=cluster_name, timeout=2,
                            **kwargs)

    good = etcd(username=ETCD_USER, password=ETCD_PASSWORD)
    assert await _roundtrip(good) == b"ok"
    node = await make_node(cluster=ClusterSettings(etcd=good, lease_ttl=2))
    assert node.ownership is not None

    with pytest.raises(CoordinatorUnavailable, match=f"etcd refused user '{ETCD_USER}'"):
        await _roundtrip(etcd(username=ETCD_USER, password="wrong"))
    with pytest.raises(CoordinatorUnavailable, match="user name is empty"):
        await _roundtrip(etcd())

    # A node with the wrong password does not start, and says why.
    wrong = Node(NodeSettings(
        dsn=dsn, port=0, partitions=16,
        cluster=ClusterSettings(etcd=etcd(username=ETCD_USER, password="wrong")),
    ))
    try:
        with pytest.raises(CoordinatorUnavailable) as caught:
            await wrong.start()
        assert f"etcd refused user '{ETCD_USER}'" in caught.value.message
        assert "authentication failed" in caught.value.message
    finally:
        await wrong.stop(grace=0)


# ---------------------------------------------------------------------- PostgreSQL over TLS


def _postgres_with_tls() -> Path:
    """A PostgreSQL build with OpenSSL: the wheel's has none, Debian's postgresql has."""
    from chronoq.embedded.pg_account import BIN_DIR

    for bin_dir in [BIN_DIR, *sorted(Path("/usr/lib/postgresql").glob("*/bin"))]:
        try:
            configure = subprocess.run(
                [str(bin_dir / "pg_config"), "--configure"], capture_output=True, text=True,
                timeout=10, check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if "--with-openssl" in configure or "--with-ssl=openssl" in configure:
            return bin_dir
    pytest.skip("no PostgreSQL build with TLS here (apt-get install postgresql)")


@pytest.fixture(scope="module")
def tls_postgres(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EmbeddedPostgres]:
    """PostgreSQL with TLS on, and a pg_hba that refuses plaintext TCP and wants a password
    from the application role."""
    base = tmp_path_factory.mktemp("pg-tls")
    certs = base / "certs"
    certs.mkdir()
    cert, key = certs / "server.pem", certs / "server-key.pem"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    hba = certs / "pg_hba.conf"
    hba.write_text(
        "local all all trust\n"
        "hostssl all postgres 127.0.0.1/32 trust\n"
        f"hostssl all {PG_USER} 127.0.0.1/32 scram-sha-256\n"
    )
    run_as = account_to_run_as()  # the account the server will run as (None unless we are root)
    if run_as is not None:  # postgres wants its key owned by itself and private
        os.chown(key, run_as.pw_uid, run_as.pw_gid)
    for path in (certs, cert, hba):
        path.chmod(0o755 if path.is_dir() else 0o644)
    key.chmod(0o600)
    server = EmbeddedPostgres(
        base / "data", durable=False, bin_dir=_postgres_with_tls(),
        settings={"ssl": "on", "ssl_cert_file": str(cert), "ssl_key_file": str(key),
                  "hba_file": str(hba), "password_encryption": "scram-sha-256"},
    )
    server.start()
    try:
        server.run_sql(f"CREATE ROLE {PG_USER} LOGIN PASSWORD '{PG_PASSWORD}'")
        server.run_sql(f"CREATE DATABASE app OWNER {PG_USER}")
        yield server
    finally:
        server.stop()


def _dsn(server: EmbeddedPostgres, password: str = PG_PASSWORD, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"postgresql://{PG_USER}:{password}@127.0.0.1:{server.port}/app?{query}"


async def test_store_over_verified_tls_with_password(tls_postgres: EmbeddedPostgres, pki: Pki) -> None:
    store = await Store.connect(
        _dsn(tls_postgres, sslmode="verify-full", sslrootcert=str(pki.ca)), min_size=1, max_size=1
    )
    try:
        row = await store.pool.fetchrow(
            "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        )
        assert row["ssl"] is True and row["version"].startswith("TLS")
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("params", "password", "message"),
    [
        ({"sslmode": "verify-full", "sslrootcert": "OTHER_CA"}, PG_PASSWORD, "certificate verify"),
        ({"sslmode": "disable"}, PG_PASSWORD, "no encryption"),
        ({"sslmode": "verify-full", "sslrootcert": "CA"}, "wrong", "password authentication"),
    ],
)
async def test_store_refusals(
    tls_postgres: EmbeddedPostgres, pki: Pki, params: dict[str, str], password: str, message: str
) -> None:
    paths = {"CA": str(pki.ca), "OTHER_CA": str(pki.other_ca)}
    params = {k: paths.get(v, v) for k, v in params.items()}
    with pytest.raises(StoreUnavailable, match=message):
        await Store.connect(_dsn(tls_postgres, password, **params), min_size=1, max_size=1)


async def test_a_node_with_an_etcd_user_survives_an_etcd_restart(
    make_node: NodeFactory, auth_etcd: EmbeddedEtcd, cluster_name: str
) -> None:
    """etcd forgets its auth tokens when it restarts; the node authenticates again by itself."""
    etcd = EtcdSettings(endpoints=auth_etcd.endpoints, cluster=cluster_name, timeout=2,
                        username=ETCD_USER, password=ETCD_PASSWORD)
    node = await make_node(cluster=ClusterSettings(etcd=etcd, lease_ttl=2))
    ownership = node.ownership
    assert isinstance(ownership, EtcdOwnership)
    await _owns_all(ownership)
    await asyncio.to_thread(auth_etcd.stop_member, 0)
    await asyncio.to_thread(auth_etcd.start_member, 0)
    # The node writes its stats every second: they must keep coming after the restart.
    reader = connect(etcd)
    try:
        key = ownership.keys.stat(node.settings.node_id)
        with translated("read stats"):
            probe = ownership.keys.root.encode() + b"probe"
            await reader.put(probe, b"after the restart")
            restarted = (await reader.get(probe)).mod_revision
            deadline = asyncio.get_running_loop().time() + 15
            while (stat := await reader.get(key)) is None or stat.mod_revision <= restarted:
                assert asyncio.get_running_loop().time() < deadline, "no writes after restart"
                await asyncio.sleep(0.1)
    finally:
        await reader.close()
    assert ownership.client.reauthentications >= 1
    await _owns_all(ownership, within=15)


async def _owns_all(ownership: EtcdOwnership, within: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while len(ownership.owned()) != 16:
        assert asyncio.get_running_loop().time() < deadline, ownership.owned()
        await asyncio.sleep(0.05)
