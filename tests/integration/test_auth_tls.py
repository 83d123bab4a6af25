"""TLS, mutual TLS and namespace-bound bearer tokens on a real node's gRPC API.

Each refusal is proven against a running node: no token, an unknown token, a token of another
namespace (for every kind of call), plaintext to a TLS port, and a missing client certificate.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chronoq import errors
from chronoq.api.v1 import tasks_pb2, tasks_pb2_grpc
from chronoq.client import Client, NewTask
from chronoq.clock import ManualClock
from chronoq.models import Lease, TaskState
from chronoq.node import Node
from tests.integration.conftest import NodeFactory
from tests.integration.pki import Pki, make_pki
from tests.integration.test_cli import cli, failed, ok

TEAM_A = "team-a-secret-0123456789"
TEAM_B = "team-b-secret-9876543210"
HASHED = "hashed-secret-for-team-c"
ADMIN = "admin-secret-abcdefabcdef"
DEFAULT_ONLY = "default-namespace-secret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.toml"
    digest = hashlib.sha256(HASHED.encode()).hexdigest()
    path.write_text(
        "[tokens]\n"
        f'"{TEAM_A}" = ["team-a"]\n'
        f'"{TEAM_B}" = ["team-b"]\n'
        f'"sha256:{digest}" = ["team-c"]\n'
        f'"{ADMIN}" = ["*"]\n'
        f'"{DEFAULT_ONLY}" = ["default"]\n'
    )
    path.chmod(0o600)  # a node refuses a token file that others may write
    return path


@pytest.fixture
async def tls_node(
    make_node: NodeFactory, clock: ManualClock, pki: Pki, token_file: Path
) -> Node:
    """A node serving TLS (no client certificates needed) and requiring tokens."""
    return await make_node(
        clock=clock, tls_cert=str(pki.server_cert), tls_key=str(pki.server_key),
        auth_tokens=str(token_file),
    )


@pytest.fixture
async def clients() -> AsyncIterator[list[Client]]:
    made: list[Client] = []
    yield made
    for client in made:
        await client.close()


@pytest.fixture
def connect(clients: list[Client], pki: Pki, tls_node: Node) -> Any:
    """A TLS client of ``tls_node`` (trusting the test CA) with the given token and namespace."""

    def make(token: str | None, namespace: str = "default", **kwargs: Any) -> Client:
        options: dict[str, Any] = {"tls_ca": str(pki.ca)} | kwargs
        client = Client(tls_node.address, namespace=namespace, token=token, timeout=5, **options)
        clients.append(client)
        return client

    return make


async def _refused(call: Any, code: str, *needles: str) -> errors.AccessDenied:
    with pytest.raises(errors.AccessDenied) as caught:
        await call
    assert caught.value.code == code, caught.value
    for needle in needles:
        assert needle in caught.value.message, (needle, caught.value.message)
    return caught.value


async def test_the_right_token_over_tls_does_everything(connect: Any, clock: ManualClock) -> None:
    client = connect(TEAM_A, "team-a")
    submitted = await client.submit("emails", payload=b"hi")
    assert submitted.task.namespace == "team-a"
    assert (await client.get(submitted.task.id)).payload == b"hi"
    assert [t.id for t in (await client.list()).tasks] == [submitted.task.id]
    (claimed,) = await client.claim(["emails"], worker_id="w", wait=timedelta(seconds=3))
    assert claimed.id == submitted.task.id
    lease = Lease(claimed.id, claimed.attempt)
    assert (await client.heartbeat([lease]))[0].ok
    assert (await client.complete(lease)).state is TaskState.SUCCEEDED
    other = await client.submit("emails", delay=timedelta(hours=1))
    assert (await client.cancel(other.task.id)).state is TaskState.CANCELLED
    made = await client.submit_many([NewTask(queue="q"), NewTask(queue="q")])
    assert len(made) == 2
    await client.create_schedule("nightly", "reports", cron="0 3 * * *")
    assert [s.spec.name for s in await client.list_schedules()] == ["nightly"]
    status = await client.status()  # cluster-wide, read-only: any valid token
    assert status.partitions == 16


async def test_hashed_token_admin_token_and_empty_namespace(connect: Any) -> None:
    assert (await connect(HASHED, "team-c").submit("q")).task.namespace == "team-c"
    admin = connect(ADMIN, "team-a")
    task = (await admin.submit("q")).task
    assert (await connect(ADMIN, "anything-else").list()).tasks == []
    assert (await admin.get(task.id)).id == task.id
    # An empty namespace means "default", and the grant is checked for "default".
    assert (await connect(DEFAULT_ONLY, "").submit("q")).task.namespace == "default"
    await _refused(connect(TEAM_A, "").submit("q"), "PERMISSION_DENIED", "'default'")


async def test_no_token_is_unauthenticated(connect: Any) -> None:
    client = connect(None, "team-a")
    await _refused(client.submit("q"), "UNAUTHENTICATED", "missing bearer token", "CHRONOQ_TOKEN")
    await _refused(client.list(), "UNAUTHENTICATED", "missing bearer token")
    await _refused(client.status(), "UNAUTHENTICATED", "missing bearer token")


async def test_wrong_token_is_unauthenticated(connect: Any) -> None:
    for token in ("not-a-token", TEAM_A + "x", hashlib.sha256(HASHED.encode()).hexdigest()):
        client = connect(token, "team-a")
        await _refused(client.submit("q"), "UNAUTHENTICATED", "unknown bearer token")
        await _refused(client.status(), "UNAUTHENTICATED", "unknown bearer token")


async def test_wrong_scheme_is_unauthenticated(
    tls_node: Node, pki: Pki
) -> None:
    creds = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    async with grpc.aio.secure_channel(tls_node.address, creds) as channel:

        stub = tasks_pb2_grpc.TaskServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListTasks(
                tasks_pb2.ListTasksRequest(namespace="team-a"),
                metadata=(("authorization", f"Basic {TEAM_A}"),), timeout=5,
            )
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_a_token_of_team_a_is_refused_in_team_b(connect: Any) -> None:
    owner = connect(TEAM_A, "team-a")
    task = (await owner.submit("emails", delay=timedelta(hours=1))).task
    assert [c for _i, c in await owner.submit_ids([NewTask(queue="bulk")] * 3)] == [True] * 3
    intruder = connect(TEAM_A, "team-b")  # team-a's token, asking for team-b
    lease = Lease(task.id, 1)
    calls = {
        "submit": intruder.submit("emails"),
        "submit_many": intruder.submit_many([NewTask(queue="q")]),
        "submit_ids": intruder.submit_ids([NewTask(queue="q")] * 3),  # the columnar form
        "get": intruder.get(task.id),
        "list": intruder.list(),
        "dead": intruder.list(dead=True),
        "cancel": intruder.cancel(task.id),
        "requeue": intruder.requeue([task.id]),
        "claim": intruder.claim(["emails"]),
        "heartbeat": intruder.heartbeat([lease]),
        "complete": intruder.complete(lease),
        "fail": intruder.fail(lease, "boom"),
        "release": intruder.release(lease),
        "schedule": intruder.create_schedule("s", "q", every=timedelta(minutes=1)),
        "schedules": intruder.list_schedules(),
        "delete_schedule": intruder.delete_schedule("s"),
    }
    for name, call in calls.items():
        denied = await _refused(call, "PERMISSION_DENIED", "'team-b'")
        assert task.id not in denied.message, name
    # Nothing happened to team-a's task.
    assert (await owner.get(task.id)).state is TaskState.SCHEDULED


async def test_team_a_tasks_are_invisible_to_team_b(connect: Any) -> None:
    secret = (await connect(TEAM_A, "team-a").submit("emails", payload=b"secret")).task
    team_b = connect(TEAM_B, "team-b")
    await team_b.submit("emails")
    # In its own namespace team-b finds no such task, and lists only its own.
    with pytest.raises(errors.NotFound) as caught:
        await team_b.get(secret.id)
    assert "secret" not in caught.value.message
    assert all(t.namespace == "team-b" for t in (await team_b.list()).tasks)
    assert secret.id not in {t.id for t in (await team_b.list()).tasks}
    with pytest.raises(errors.NotFound):
        await team_b.cancel(secret.id)
    # Asking for team-a's namespace with team-b's token is refused before anything is read.
    peek = connect(TEAM_B, "team-a")
    denied = await _refused(peek.get(secret.id), "PERMISSION_DENIED", "'team-a'")
    assert "secret" not in denied.message and "emails" not in denied.message
    # A batch that sneaks one task of another namespace in is refused as a whole.

    sneaky = tasks_pb2.SubmitBatchRequest(tasks=[
        NewTask(queue="q").to_pb("team-b"), NewTask(queue="q").to_pb("team-a"),
    ])
    with pytest.raises(errors.AccessDenied) as batch:
        await team_b._call(lambda n: n.tasks.SubmitBatch, sneaky)
    assert batch.value.code == "PERMISSION_DENIED" and "'team-a'" in batch.value.message
    assert [t.id for t in (await connect(TEAM_A, "team-a").list()).tasks] == [secret.id]


async def test_plaintext_client_to_a_tls_node_fails(tls_node: Node, clients: list[Client]) -> None:
    plain = Client(tls_node.address, namespace="team-a", token=TEAM_A, timeout=2)
    clients.append(plain)
    with pytest.raises(errors.Unavailable):
        await plain.submit("q")


async def test_client_trusting_another_ca_fails(connect: Any, pki: Pki) -> None:
    client = connect(TEAM_A, "team-a", tls_ca=str(pki.other_ca))
    with pytest.raises(errors.Unavailable):
        await client.submit("q")


async def test_health_needs_no_token(tls_node: Node, pki: Pki) -> None:
    creds = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    async with grpc.aio.secure_channel(tls_node.address, creds) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_mutual_tls_needs_a_client_certificate(
    make_node: NodeFactory, clock: ManualClock, pki: Pki, clients: list[Client]
) -> None:
    node = await make_node(
        clock=clock, tls_cert=str(pki.server_cert), tls_key=str(pki.server_key),
        tls_client_ca=str(pki.ca),
    )

    def client(**kwargs: Any) -> Client:
        made = Client(node.address, tls_ca=str(pki.ca), timeout=2, **kwargs)
        clients.append(made)
        return made

    with pytest.raises(errors.Unavailable):
        await client().submit("q")
    stranger = client(tls_cert=str(pki.other_client_cert), tls_key=str(pki.other_client_key))
    with pytest.raises(errors.Unavailable):
        await stranger.submit("q")
    trusted = client(tls_cert=str(pki.client_cert), tls_key=str(pki.client_key))
    assert (await trusted.submit("q")).created


async def test_bad_security_settings_stop_the_node_before_it_starts(
    make_node: NodeFactory, pki: Pki, tmp_path: Path
) -> None:
    bad_tokens = tmp_path / "tokens.toml"
    bad_tokens.write_text('[tokens]\n"t" = "team-a"\n')
    bad_tokens.chmod(0o600)
    short_tokens = tmp_path / "short.toml"
    short_tokens.write_text('[tokens]\n"team-a-secret" = ["team-a"]\n')
    short_tokens.chmod(0o600)
    open_tokens = tmp_path / "open.toml"
    open_tokens.write_text(f'[tokens]\n"{TEAM_A}" = ["team-a"]\n')
    open_tokens.chmod(0o666)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"auth_tokens": str(tmp_path / "missing.toml")}, "auth_tokens: cannot read"),
        ({"auth_tokens": str(bad_tokens)}, "namespaces must be a list"),
        ({"auth_tokens": str(short_tokens)}, r"\(for team-a\) is shorter than 16 characters"),
        ({"auth_tokens": str(open_tokens)}, "writable by group or others .* chmod 600"),
        ({"tls_cert": str(pki.server_cert)}, "tls_cert and tls_key go together"),
        ({"tls_client_ca": str(pki.ca)}, "tls_client_ca needs tls_cert and tls_key"),
        ({"tls_cert": str(pki.server_cert), "tls_key": str(pki.client_key)},
         "are not a certificate and its key"),
        ({"tls_cert": str(tmp_path / "nope.pem"), "tls_key": str(pki.server_key)},
         "tls_cert: cannot read"),
        ({"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key),
          "tls_client_ca": str(bad_tokens)}, "tls_client_ca: "),
    ]
    for overrides, message in cases:
        with pytest.raises(errors.ConfigError, match=message):
            await make_node(**overrides)


async def test_client_refuses_a_token_that_cannot_be_metadata() -> None:
    with pytest.raises(errors.ConfigError, match="printable ASCII"):
        Client("127.0.0.1:1", token="tok en")
    with pytest.raises(errors.ConfigError, match="tls_cert and tls_key go together"):
        Client("127.0.0.1:1", tls_cert="c.pem")


async def test_cli_client_options(tls_node: Node, pki: Pki) -> None:

    address = tls_node.address
    secure = ["--tls-ca", str(pki.ca)]
    task_id = ok(await cli("--token", TEAM_A, *secure, "submit", "q", "-a", address,
                           "-n", "team-a")).strip()
    env = {"CHRONOQ_TOKEN": TEAM_A, "CHRONOQ_TLS_CA": str(pki.ca)}
    shown = ok(await cli("get", task_id, "--json", "-a", address, "-n", "team-a", env=env))
    assert task_id in shown
    failed(await cli(*secure, "get", task_id, "-a", address, "-n", "team-a"), 1,
           "UNAUTHENTICATED", "missing bearer token: pass --token / CHRONOQ_TOKEN")
    failed(await cli("--token", TEAM_A, *secure, "list", "-a", address, "-n", "team-b"), 1,
           "PERMISSION_DENIED", "'team-b'")
    failed(await cli("--token", TEAM_A, "--tls-ca", "/nonexistent.pem", "list", "-a", address),
           1, "tls_ca: cannot read /nonexistent.pem")


async def test_cli_help_lists_the_security_flags() -> None:

    node_help = ok(await cli("node", "--help"))
    for flag in ("--tls-cert", "--tls-key", "--tls-client-ca", "--auth-tokens", "--etcd-user",
                 "--etcd-password", "--etcd-password-file", "--etcd-ca", "--etcd-cert", "--etcd-key",
                 "CHRONOQ_TLS_CLIENT_CA", "CHRONOQ_ETCD_PASSWORD"):
        assert flag in node_help, flag
    top = ok(await cli("--help"))
    for flag in ("--token", "--tls-ca", "--client-cert", "--client-key", "CHRONOQ_TOKEN"):
        assert flag in top, flag


async def test_cli_node_with_mutual_tls_and_tokens(dsn: str, pki: Pki, token_file: Path) -> None:
    """``chronoq node`` wires its flags through: a TLS client with a certificate and a token
    works, one without the certificate does not."""
    node = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "chronoq.cli", "node", "--dsn", dsn, "--port", "0",
        "--node-id", "tls-node", "--partitions", "16",
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
        "--tls-client-ca", str(pki.ca), "--auth-tokens", str(token_file),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert node.stdout is not None
        line = (await asyncio.wait_for(node.stdout.readline(), 30)).decode()
        match = re.search(r"serving on (\S+)", line)
        assert match, line
        address = match.group(1)
        async with Client(address, namespace="team-a", token=TEAM_A, tls_ca=str(pki.ca),
                          tls_cert=str(pki.client_cert), tls_key=str(pki.client_key)) as trusted:
            assert (await trusted.submit("q")).created
        async with Client(address, namespace="team-a", token=TEAM_A, tls_ca=str(pki.ca),
                          timeout=2) as no_cert:
            with pytest.raises(errors.Unavailable):
                await no_cert.submit("q")
    finally:
        node.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(node.communicate(), 20)
    assert node.returncode == 0, stderr.decode()


async def test_drain_needs_an_admin_token(connect: Any) -> None:
    await _refused(connect(TEAM_A, "team-a").drain(), "PERMISSION_DENIED", "cluster-wide calls",
                   "Drain")
    await _refused(connect(None).drain(), "UNAUTHENTICATED", "missing bearer token")
    assert set(await connect(ADMIN).drain()) <= set(range(16))  # the admin may


async def test_an_edited_token_file_takes_effect_without_a_restart(
    make_node: NodeFactory, tmp_path: Path, clients: list[Client]
) -> None:
    """Rotating a token: the new one works and the revoked one is refused within seconds; a
    broken edit keeps the tokens in force."""
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens]\n"{TEAM_A}" = ["team-a"]\n')
    path.chmod(0o600)
    node = await make_node(auth_tokens=str(path))
    old = Client(node.address, namespace="team-a", token=TEAM_A, timeout=5)
    new = Client(node.address, namespace="team-a", token=TEAM_B, timeout=5)
    clients += [old, new]
    assert (await old.submit("q")).task.namespace == "team-a"
    await _refused(new.submit("q"), "UNAUTHENTICATED")

    path.write_text(f'[tokens]\n"{TEAM_B}" = ["team-a"]\n')
    for _ in range(50):  # the file is looked at once a second
        try:
            await new.submit("q")
            break
        except errors.AccessDenied:
            await asyncio.sleep(0.1)
    await _refused(old.submit("q"), "UNAUTHENTICATED", "unknown bearer token")
    assert len((await new.list()).tasks) == 2  # nothing accepted before was lost

    path.write_text("[tokens]\nbroken")
    await asyncio.sleep(1.5)
    assert (await new.submit("q")).task.namespace == "team-a"
