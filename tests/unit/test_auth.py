"""Token files, grants and the namespaces of each request type (no server)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from chronoq.api.v1 import cluster_pb2, schedules_pb2, tasks_pb2, worker_pb2
from chronoq.auth import MIN_TOKEN_LENGTH, TokenAuth, TokenFile, bearer_token
from chronoq.errors import ConfigError, NamespaceDenied, Unauthenticated
from chronoq.node.edge.auth_interceptor import OPEN_CLUSTER_METHODS, request_namespaces

# Long enough for a token file (MIN_TOKEN_LENGTH); not random, which only tests may be.
TOK_A = "tok-a-0123456789abcdef"
TOK_AB = "tok-ab-0123456789abcdef"
TOK_HASHED = "tok-hashed-0123456789abcdef"
TOK_ADMIN = "tok-admin-0123456789abcdef"
AUTH = TokenAuth.from_toml(
    "[tokens]\n"
    f'"{TOK_A}" = ["team-a"]\n'
    f'"{TOK_AB}" = ["team-a", "team-b"]\n'
    f'"sha256:{hashlib.sha256(TOK_HASHED.encode()).hexdigest()}" = ["team-c"]\n'
    f'"{TOK_ADMIN}" = ["*"]\n'
)


def test_tokens_grant_their_namespaces_only() -> None:
    a = AUTH.authenticate(TOK_A)
    assert a.allows("team-a") and not a.allows("team-b") and not a.allows("")
    AUTH.authorize(AUTH.authenticate(TOK_AB), {"team-a", "team-b"})
    with pytest.raises(NamespaceDenied, match="'team-b'") as denied:
        AUTH.authorize(a, {"team-a", "team-b"}, "SubmitBatch")
    assert denied.value.namespace == "team-b" and "SubmitBatch" in denied.value.message
    assert AUTH.authenticate(TOK_HASHED).allows("team-c")
    admin = AUTH.authenticate(TOK_ADMIN)
    assert admin.admin and admin.allows("anything")
    AUTH.authorize(admin, None)  # cluster-wide
    with pytest.raises(NamespaceDenied, match="cluster-wide"):
        AUTH.authorize(a, None, "Drain")


def test_unknown_and_missing_tokens() -> None:
    with pytest.raises(Unauthenticated, match="missing bearer token: pass --token"):
        AUTH.authenticate(None)
    hashed = hashlib.sha256(TOK_HASHED.encode()).hexdigest()
    for token in ("tok-b-0123456789abcdef", TOK_A + " ", hashed, "sha256:x"):
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
        (
            f'[tokens]\n"{TOK_A}" = ["x"]\n"sha256:{hashlib.sha256(TOK_A.encode()).hexdigest()}" = '
            '["y"]\n',
            "listed twice",
        ),
    ],
)
def test_bad_token_files_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        TokenAuth.from_toml(text, source="tokens.toml")
    assert caught.value.message.startswith("tokens.toml: ")
    assert '"t"' not in caught.value.message  # errors never echo a token


def test_a_short_token_is_refused_by_its_label_and_namespaces() -> None:
    short = "only-15-chars.."
    assert len(short) == MIN_TOKEN_LENGTH - 1
    text = f'[tokens]\n"{TOK_A}" = ["team-a"]\n"{short}" = ["team-b", "default"]\n'
    with pytest.raises(ConfigError) as caught:
        TokenAuth.from_toml(text, source="tokens.toml")
    label = f"sha256:{hashlib.sha256(short.encode()).hexdigest()[:8]}"
    message = caught.value.message
    assert message.startswith(f"tokens.toml: token {label}")
    assert "(for default, team-b) is shorter than 16 characters" in message
    assert short not in message
    # A digest says nothing about the token's length; one 16 characters long is enough.
    TokenAuth.from_toml(f'[tokens]\n"{short}x" = ["team-a"]\n')
    TokenAuth.from_toml(f'[tokens]\n"sha256:{hashlib.sha256(b"x").hexdigest()}" = ["team-a"]\n')


def _token_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666, 0o622])
def test_a_token_file_that_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = _token_file(tmp_path / "tokens.toml", f'[tokens]\n"{TOK_A}" = ["team-a"]\n', mode)
    with pytest.raises(ConfigError, match=f"writable by group or others .*chmod 600 {path}"):
        TokenFile(path)


def test_a_token_file_that_others_may_read_is_a_warning_with_tokens_in_clear(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clear = _token_file(tmp_path / "clear.toml", f'[tokens]\n"{TOK_A}" = ["team-a"]\n', 0o644)
    assert len(TokenFile(clear).current()) == 1
    assert "readable by group or others and holds 1 tokens in clear" in caplog.text
    assert TOK_A not in caplog.text
    caplog.clear()
    digest = hashlib.sha256(TOK_A.encode()).hexdigest()
    hashed = _token_file(tmp_path / "hashed.toml", f'[tokens]\n"sha256:{digest}" = ["a"]\n', 0o644)
    TokenFile(hashed)
    _token_file(tmp_path / "private.toml", f'[tokens]\n"{TOK_A}" = ["team-a"]\n', 0o600)
    TokenFile(tmp_path / "private.toml")
    assert caplog.text == ""


def test_a_token_file_opened_to_others_keeps_the_tokens_in_force(tmp_path: Path) -> None:
    path = _token_file(tmp_path / "tokens.toml", f'[tokens]\n"{TOK_A}" = ["team-a"]\n')
    ticks = _Ticks()
    tokens = TokenFile(path, interval=1.0, monotonic=ticks)
    path.write_text(f'[tokens]\n"{TOK_A}" = ["*"]\n')  # an edit that grants everything ...
    path.chmod(0o666)  # ... in a file that anyone may write: not applied
    ticks.now = 1.0
    assert not tokens.current().authenticate(TOK_A).admin
    assert tokens.reloads == 0
    path.chmod(0o600)  # the mode alone changed: seen, and the edit applies now
    ticks.now = 2.0
    assert tokens.current().authenticate(TOK_A).admin
    assert tokens.reloads == 1


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
    admin_only = {
        f"/chronoq.v1.ClusterService/{m}"
        for m in ("Drain", "AddShard", "MovePartitions", "Rebalance")
    }
    assert set(cluster_wide) - OPEN_CLUSTER_METHODS <= admin_only


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
    columns = tasks_pb2.SubmitBatchRequest(shared=tasks_pb2.TaskSpec(namespace="b"), count=3)
    assert request_namespaces(columns) == {"b"}  # the columnar form: its shared spec's
    whole = tasks_pb2.SubmitBatchRequest(tasks=[tasks_pb2.TaskSpec(namespace="a")])
    assert request_namespaces(whole) == {"a"}  # no shared spec: it names nothing
    both = tasks_pb2.SubmitBatchRequest(
        shared=tasks_pb2.TaskSpec(), tasks=[tasks_pb2.TaskSpec(namespace="a")]
    )
    assert request_namespaces(both) == {"a", "default"}
    assert request_namespaces(tasks_pb2.SubmitRequest()) == {"default"}
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
    path = _token_file(tmp_path / "tokens.toml", '[tokens]\n"old-token-0123456789" = ["team-a"]\n')
    ticks = _Ticks()
    tokens = TokenFile(path, interval=1.0, monotonic=ticks)
    assert tokens.current().authenticate("old-token-0123456789").allows("team-a")

    path.write_text('[tokens]\n"new-token-0123456789" = ["team-b"]\n')
    ticks.now = 0.5  # not due yet: no stat, the old tokens still hold
    assert tokens.current().authenticate("old-token-0123456789")
    ticks.now = 1.0
    assert tokens.current().authenticate("new-token-0123456789").allows("team-b")
    with pytest.raises(Unauthenticated):
        tokens.current().authenticate("old-token-0123456789")
    assert tokens.reloads == 1

    path.write_text("[tokens\n")  # a typo must not lock everyone out
    ticks.now = 2.0
    assert tokens.current().authenticate("new-token-0123456789")
    path.unlink()  # nor may a deleted file
    ticks.now = 3.0
    assert tokens.current().authenticate("new-token-0123456789")
    _token_file(path, '[tokens]\n"third-token-0123456789" = ["team-c"]\n')
    ticks.now = 4.0
    assert tokens.current().authenticate("third-token-0123456789").allows("team-c")
    assert tokens.reloads == 2


def test_a_token_file_must_be_valid_at_start(tmp_path: Path) -> None:
    path = _token_file(tmp_path / "tokens.toml", "[tokens]\n")
    with pytest.raises(ConfigError, match="no tokens"):
        TokenFile(path)
    with pytest.raises(ConfigError, match="cannot read"):
        TokenFile(tmp_path / "missing.toml")
