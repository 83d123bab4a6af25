"""Token files, grants and the namespaces of each request type (no server)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from chronoq.api.v1 import cluster_pb2, schedules_pb2, tasks_pb2, worker_pb2
from chronoq.auth import TokenAuth, TokenFile, bearer_token
from chronoq.errors import ConfigError, NamespaceDenied, Unauthenticated
from chronoq.node.auth_interceptor import OPEN_CLUSTER_METHODS, request_namespaces

AUTH = TokenAuth.from_toml(
    "[tokens]\n"
    '"tok-a" = ["team-a"]\n'
    '"tok-ab" = ["team-a", "team-b"]\n'
    f'"sha256:{hashlib.sha256(b"tok-hashed").hexdigest()}" = ["team-c"]\n'
    '"tok-admin" = ["*"]\n'
)


def test_tokens_grant_their_namespaces_only() -> None:
    a = AUTH.authenticate("tok-a")
    assert a.allows("team-a") and not a.allows("team-b") and not a.allows("")
    AUTH.authorize(AUTH.authenticate("tok-ab"), {"team-a", "team-b"})
    with pytest.raises(NamespaceDenied, match="'team-b'") as denied:
        AUTH.authorize(a, {"team-a", "team-b"}, "SubmitBatch")
    assert denied.value.namespace == "team-b" and "SubmitBatch" in denied.value.message
    assert AUTH.authenticate("tok-hashed").allows("team-c")
    admin = AUTH.authenticate("tok-admin")
    assert admin.admin and admin.allows("anything")
    AUTH.authorize(admin, None)  # cluster-wide
    with pytest.raises(NamespaceDenied, match="cluster-wide"):
        AUTH.authorize(a, None, "Drain")


def test_unknown_and_missing_tokens() -> None:
    with pytest.raises(Unauthenticated, match="missing bearer token: pass --token"):
        AUTH.authenticate(None)
    for token in ("tok-b", "tok-a ", hashlib.sha256(b"tok-hashed").hexdigest(), "sha256:x"):
        with pytest.raises(Unauthenticated, match="unknown bearer token"):
            AUTH.authenticate(token)


def test_bearer_header() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not toml [", "not valid TOML"),
        ("[other]\n", "needs a [tokens] table"),
        ("[tokens]\n", "no tokens"),
        ('[tokens]\n"t" = "team-a"\n', "namespaces must be a list"),
        ('[tokens]\n"t" = []\n', "grants no namespace"),
        ('[tokens]\n"t" = ["bad name!"]\n', "outside"),
        ('[tokens]\n"t" = [1]\n', "not a string"),
        ('[tokens]\n"a b" = ["x"]\n', "without spaces"),
        ('[tokens]\n"" = ["x"]\n', "non-empty"),
        ('[tokens]\n"sha256:abcd" = ["x"]\n', "64 hex digits"),
        (f'[tokens]\n"t" = ["x"]\n"sha256:{hashlib.sha256(b"t").hexdigest()}" = ["y"]\n',
         "listed twice"),
    ],
)
def test_bad_token_files_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        TokenAuth.from_toml(text, source="tokens.toml")
    assert caught.value.message.startswith("tokens.toml: ")
    assert "\"t\"" not in caught.value.message  # errors never echo a token


def test_every_request_type_names_its_namespaces() -> None:
    """Every chronoq RPC either carries namespaces the interceptor finds, or is cluster-wide;
    the cluster-wide ones are exactly Status (any token) and what needs a "*" token."""
    cluster_wide = []
    for module in (tasks_pb2, worker_pb2, schedules_pb2, cluster_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                request = getattr(module, method.input_type.name)()
                if request_namespaces(request) is None:
                    cluster_wide.append(f"/{service.full_name}/{method.name}")
    assert "/chronoq.v1.ClusterService/Status" in cluster_wide
    assert set(cluster_wide) - OPEN_CLUSTER_METHODS <= {"/chronoq.v1.ClusterService/Drain"}


def test_request_namespaces() -> None:
    assert request_namespaces(tasks_pb2.GetTaskRequest(id="x")) == {"default"}
    assert request_namespaces(tasks_pb2.ListTasksRequest(namespace="a")) == {"a"}
    submit = tasks_pb2.SubmitRequest(task=tasks_pb2.TaskSpec(namespace="a"))
    assert request_namespaces(submit) == {"a"}
    batch = tasks_pb2.SubmitBatchRequest(
        tasks=[tasks_pb2.TaskSpec(namespace="a"), tasks_pb2.TaskSpec()]
    )
    assert request_namespaces(batch) == {"a", "default"}
    assert request_namespaces(tasks_pb2.SubmitBatchRequest()) == set()
    assert request_namespaces(schedules_pb2.ScheduleRef(namespace="s")) == {"s"}
    assert request_namespaces(schedules_pb2.ScheduleSpec()) == {"default"}
    assert request_namespaces(cluster_pb2.StatusRequest()) is None


class _Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_token_file_reloads_changes_and_keeps_tokens_over_a_broken_edit(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text('[tokens]\n"old-token" = ["team-a"]\n')
    ticks = _Ticks()
    tokens = TokenFile(path, interval=1.0, monotonic=ticks)
    assert tokens.current().authenticate("old-token").allows("team-a")

    path.write_text('[tokens]\n"new-token" = ["team-b"]\n')
    ticks.now = 0.5  # not due yet: no stat, the old tokens still hold
    assert tokens.current().authenticate("old-token")
    ticks.now = 1.0
    assert tokens.current().authenticate("new-token").allows("team-b")
    with pytest.raises(Unauthenticated):
        tokens.current().authenticate("old-token")
    assert tokens.reloads == 1

    path.write_text("[tokens\n")  # a typo must not lock everyone out
    ticks.now = 2.0
    assert tokens.current().authenticate("new-token")
    path.unlink()  # nor may a deleted file
    ticks.now = 3.0
    assert tokens.current().authenticate("new-token")
    path.write_text('[tokens]\n"third-token" = ["team-c"]\n')
    ticks.now = 4.0
    assert tokens.current().authenticate("third-token").allows("team-c")
    assert tokens.reloads == 2


def test_a_token_file_must_be_valid_at_start(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text("[tokens]\n")
    with pytest.raises(ConfigError, match="no tokens"):
        TokenFile(path)
    with pytest.raises(ConfigError, match="cannot read"):
        TokenFile(tmp_path / "missing.toml")
