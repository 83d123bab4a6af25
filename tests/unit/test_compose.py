"""docker-compose.yml, Dockerfile and docker/healthcheck.py, checked without a Docker engine.

- The compose file is validated by the compose tool itself (`docker compose config -q`, the v2
  plugin, or `docker-compose config -q`, Debian's v1 package): `config` needs no daemon.
  Skipped, with the install command, where neither is installed.
- Its structure is read with PyYAML: the etcd cluster, PostgreSQL, the nodes and workers; and
  every chronoq command in it is parsed by the real CLI (`chronoq node`, `worker`, `lab`), so a
  renamed or removed flag breaks this test, not a deployment.
- The Dockerfile is read line by line (no hadolint here): base, non-root user, entrypoint,
  health check, exposed ports, and that what it copies exists.
- The health probe runs against a real gRPC health server and a real HTTP server.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from fnmatch import fnmatch
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
import typer
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from chronoq.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
HEALTHCHECK = ROOT / "docker" / "healthcheck.py"

APT_INSTALL = "apt-get install -y --no-install-recommends docker-compose"
ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"
PATRONI_IMAGE = "chronoq-patroni:local"  # docker/patroni: postgres:16 with Patroni
BASE_IMAGE = "python:3.11-slim"

# ------------------------------------------------------------------------------- helpers

_REQUIRED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?\?")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def _stand_in(name: str) -> str:
    """What a required variable (`${X:?why}`) stands for in these tests: visible anywhere."""
    return f"<{name}>"


def _substitute(m: re.Match[str]) -> str:
    if m.group(2) in (":?", "?"):
        return _stand_in(m.group(1))
    return m.group(3) or ""


def _interpolate(value: Any) -> Any:
    """Compose interpolation with every variable at its default (`${X:-d}` -> d, `${X}` -> "",
    a required `${X:?why}` -> its stand-in)."""
    if isinstance(value, str):
        return _VARIABLE.sub(_substitute, value).replace("$$", "$")
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE.read_text())  # safe_load applies the `<<` merge keys
    assert isinstance(raw, dict)
    return _interpolate(raw)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]  # type: ignore[no-any-return]


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    assert isinstance(command, list), f"write commands as lists, not one string: {command!r}"
    return [str(part) for part in command]


def _flags(args: list[str]) -> dict[str, list[str]]:
    """`--name=value`, `--name value` and bare `--name` flags, each name with all its values."""
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            if not sep and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value, i = args[i + 1], i + 1
            flags.setdefault(name, []).append(value)
        i += 1
    return flags


def _flag(args: list[str], name: str) -> str:
    values = _flags(args).get(name)
    assert values and len(values) == 1, f"expected one {name} in {args}"
    return values[0]


def _of_role(services: dict[str, dict[str, Any]], role: str) -> dict[str, dict[str, Any]]:
    """The chronoq services that run `chronoq ROLE` (the image's entrypoint is `chronoq`)."""
    return {n: s for n, s in services.items() if _command(s)[:1] == [role]}


def _of_image(services: dict[str, dict[str, Any]], image: str) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if s.get("image") == image}


def _cli() -> Any:
    return typer.main.get_command(app)


def _healthy_deps(service: dict[str, Any]) -> set[str]:
    deps = service.get("depends_on", {})
    assert isinstance(deps, dict), "depends_on must use the long form with a condition"
    return {name for name, d in deps.items() if d.get("condition") == "service_healthy"}


def _one_shot(services: dict[str, dict[str, Any]]) -> set[str]:
    """The services others wait on to have ended well (`service_completed_successfully`)."""
    return {
        dep
        for svc in services.values()
        for dep, d in (svc.get("depends_on") or {}).items()
        if d.get("condition") == "service_completed_successfully"
    }


def _health_test(service: dict[str, Any]) -> list[str]:
    check = service.get("healthcheck")
    assert check and not check.get("disable"), "a health check is required here"
    test = check["test"]
    assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL"), test
    return [str(t) for t in test]


def _container_port(spec: str) -> str:
    """The container side of a compose `ports` short entry: `127.0.0.1:7071:7070` -> 7070."""
    return str(spec).split(":")[-1].split("/")[0]


# --------------------------------------------------------------------------- the compose tool


def _compose_tool() -> list[str] | None:
    """`docker compose` (v2 plugin) where it answers, else `docker-compose` (v1), else None."""
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    v1 = shutil.which("docker-compose")
    return [v1] if v1 else None


def test_compose_file_validates_with_the_compose_tool() -> None:
    tool = _compose_tool()
    if tool is None:
        pytest.skip(
            "no compose tool to validate docker-compose.yml: neither `docker compose` "
            f"(v2 plugin) nor `docker-compose` (v1); on Debian: {APT_INSTALL}"
        )
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("CHRONOQ_", "COMPOSE_"))
    }  # validate the defaults

    def config(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*tool, "-f", str(COMPOSE), "--profile", "lab", "config", "-q"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
            env=env | extra,
        )

    # No default passwords: the tool itself refuses to go on without each one.
    required = sorted(set(_REQUIRED.findall(COMPOSE.read_text())))
    assert required
    for name in required:
        result = config({n: "a-secret" for n in required if n != name})
        assert result.returncode != 0 and name in (result.stderr + result.stdout), name
    result = config({n: "a-secret" for n in required})
    assert result.returncode == 0, f"{' '.join(tool)} config: {result.stderr or result.stdout}"


# --------------------------------------------------------------------------- etcd


def test_three_etcd_members_form_one_cluster(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    members = _of_image(services, ETCD_IMAGE)
    assert len(members) == 3, f"a 3-member etcd cluster, found {sorted(members)}"
    clusters, tokens = set(), set()
    for name, svc in members.items():
        flags = {k: v[-1] for k, v in _flags(_command(svc)).items()}
        assert flags["--name"] == name, "the member name is its service name (its DNS name)"
        assert flags["--initial-advertise-peer-urls"] == f"http://{name}:2380"
        assert flags["--advertise-client-urls"] == f"http://{name}:2379"
        assert flags["--listen-client-urls"].endswith(":2379")
        assert flags["--listen-peer-urls"].endswith(":2380")
        assert flags["--initial-cluster-state"] == "new"
        initial = dict(entry.split("=", 1) for entry in flags["--initial-cluster"].split(","))
        assert initial == {m: f"http://{m}:2380" for m in members}, (
            f"{name}: --initial-cluster must list all 3 members"
        )
        clusters.add(flags["--initial-cluster"])
        tokens.add(flags["--initial-cluster-token"])
        # Its data lives on its own named volume, at --data-dir.
        mounts = dict(str(v).split(":")[:2] for v in svc["volumes"])
        volume = {target: source for source, target in mounts.items()}[flags["--data-dir"]]
        assert volume in compose["volumes"], f"{name}: {volume} is not a named volume"
        test = _health_test(svc)
        assert test[0] == "CMD", "the etcd image has no shell: exec form only"
        assert any(t.endswith("etcdctl") for t in test), test
        assert test[-2:] == ["endpoint", "health"], test
        assert svc.get("restart") in ("always", "unless-stopped", "on-failure")
    assert len(clusters) == 1 and len(tokens) == 1, "one --initial-cluster and token for all"
    volumes = {str(v).split(":")[0] for svc in members.values() for v in svc["volumes"]}
    assert len(volumes) == 3, "each member its own volume"


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_is_three_patroni_members_and_the_nodes_reach_the_primary(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    members = _of_image(services, PATRONI_IMAGE)
    assert len(members) == 3, f"3 PostgreSQL members under Patroni, found {sorted(members)}"
    etcd = sorted(_of_image(services, ETCD_IMAGE))
    users, passwords, volumes = set(), set(), set()
    for name, pg in members.items():
        env = pg["environment"]
        assert env["PATRONI_NAME"] == name
        assert env["PATRONI_POSTGRESQL_CONNECT_ADDRESS"] == f"{name}:5432"
        assert env["PATRONI_RESTAPI_CONNECT_ADDRESS"] == f"{name}:8008"
        hosts = [h.strip("'") for h in env["PATRONI_ETCD3_HOSTS"].split(",")]
        assert hosts == [f"{m}:2379" for m in etcd], f"{name}: Patroni's lock in our etcd"
        users.add(env["PATRONI_SUPERUSER_USERNAME"])
        passwords.add(env["PATRONI_SUPERUSER_PASSWORD"])
        source, target = str(pg["volumes"][0]).split(":")[:2]
        assert target == "/var/lib/postgresql/data" and source in compose["volumes"]
        volumes.add(source)
        assert "pg_isready" in " ".join(_health_test(pg))
        assert pg.get("restart") in ("always", "unless-stopped", "on-failure")
        assert _healthy_deps(pg) >= set(etcd), f"{name}: starts after etcd is healthy"
        assert (ROOT / pg["build"]["context"] / "Dockerfile").is_file()
    assert len(users) == 1 and len(passwords) == 1 and len(volumes) == 3
    [user], [password] = users, passwords
    assert password == _stand_in("CHRONOQ_DB_SUPERUSER_PASSWORD")
    patroni = (ROOT / "docker" / "patroni" / "patroni.yml").read_text()
    dcs = yaml.safe_load(patroni)["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] and dcs["synchronous_mode_strict"] and dcs["failsafe_mode"]
    for node_name, node in _of_role(services, "node").items():
        dsn = urlsplit(_flag(_command(node), "--dsn"))
        credentials, _, hosts = dsn.netloc.rpartition("@")
        assert dsn.scheme == "postgresql" and dsn.path == "/chronoq", node_name
        # The nodes' own role, not the superuser; its password from the environment.
        assert credentials == "chronoq" != user, node_name
        assert node["environment"]["PGPASSWORD"] == _stand_in("CHRONOQ_DB_PASSWORD")
        assert sorted(hosts.split(",")) == [f"{m}:5432" for m in sorted(members)], node_name
        assert dsn.query == "target_session_attrs=read-write", node_name


# --------------------------------------------------------------------------- nodes


def test_three_nodes_share_etcd_postgres_and_a_cluster_name(
    services: dict[str, dict[str, Any]],
) -> None:
    nodes = _of_role(services, "node")
    assert len(nodes) == 3, f"3 chronoq nodes, found {sorted(nodes)}"
    etcd = sorted(_of_image(services, ETCD_IMAGE))
    pgs = set(_of_image(services, PATRONI_IMAGE))
    clusters, ids = set(), set()
    for name, svc in nodes.items():
        args = _command(svc)
        endpoints = _flag(args, "--etcd").split(",")
        assert sorted(endpoints) == [f"{m}:2379" for m in etcd], (
            f"{name}: --etcd must list every etcd member"
        )
        clusters.add(_flag(args, "--cluster"))
        # The chaos docker backend names nodes by their service: node id == service name.
        ids.add(_flag(args, "--node-id"))
        assert _flag(args, "--node-id") == name
        assert _flag(args, "--host") == "0.0.0.0", f"{name}: bind every interface"
        assert _healthy_deps(svc) >= {*etcd, *pgs}, (
            f"{name}: depends_on every etcd and PostgreSQL member with condition service_healthy"
        )
        test = _health_test(svc)
        assert any("healthcheck.py" in t for t in test), test
        assert svc.get("restart") in ("always", "unless-stopped", "on-failure")
        ports = {_container_port(p) for p in svc.get("ports", [])}
        assert _flag(args, "--port") in ports, f"{name}: publish the gRPC port"
    assert len(clusters) == 1, "all nodes in one --cluster"
    assert len(ids) == 3


def test_every_flag_and_env_var_of_the_chronoq_services_exists_in_the_cli(
    services: dict[str, dict[str, Any]],
) -> None:
    """Each command is parsed by the real CLI (unknown flags and bad values raise)."""
    cli = _cli()
    global_envvars = {p.envvar for p in cli.params if p.envvar}
    roles = {"node", "worker", "lab", "etcd"}
    seen: set[str] = set()
    for name, svc in services.items():
        args = _command(svc)
        if args[:1] and args[0] in roles:
            seen.add(args[0])
            command, rest = cli.commands[args[0]], args[1:]
            envvars = set(global_envvars)
            group = getattr(command, "commands", None)  # typer's groups: its own click's
            if group is not None and rest[:1] and rest[0] in group:
                envvars |= {p.envvar for p in command.params if p.envvar}
                command, rest = group[rest[0]], rest[1:]  # `chronoq etcd init`
            try:
                command.make_context(args[0], rest)
            except typer.TyperException as exc:  # no such option, a bad value, a missing one
                pytest.fail(f"{name}: `chronoq {' '.join(args)}`: {exc.format_message()}")
            envvars |= {p.envvar for p in command.params if p.envvar}
            for var in svc.get("environment") or {}:
                if var.startswith("CHRONOQ_"):
                    assert var in envvars, f"{name}: chronoq {args[0]} reads no {var}"
    assert seen == roles


@pytest.mark.parametrize("role", ["node", "worker", "lab"])
def test_the_flags_used_appear_in_the_commands_help(
    role: str, services: dict[str, dict[str, Any]]
) -> None:
    """What an operator reads: `chronoq ROLE --help` shows every flag compose passes."""
    result = CliRunner().invoke(
        app, [role, "--help"], env={"COLUMNS": "220", "TERMINAL_WIDTH": "220", "NO_COLOR": "1"}
    )
    assert result.exit_code == 0, result.output
    used = {flag for svc in _of_role(services, role).values() for flag in _flags(_command(svc))}
    assert used
    for flag in used:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", result.output), (
            f"`chronoq {role} --help` does not show {flag}"
        )


# --------------------------------------------------------------------------- workers, lab


def test_two_workers_reach_the_nodes(services: dict[str, dict[str, Any]]) -> None:
    workers = _of_role(services, "worker")
    assert len(workers) == 2, f"2 worker services, found {sorted(workers)}"
    nodes = _of_role(services, "node")
    names = set(nodes)
    for svc in nodes.values():
        networks = svc.get("networks") or {}
        for net in networks.values() if isinstance(networks, dict) else ():
            names |= set((net or {}).get("aliases", []))
    for name, svc in workers.items():
        args = _command(svc)
        host, _, port = _flag(args, "--address").rpartition(":")
        assert host in names and port == "7070", f"{name}: --address must name a node (or alias)"
        assert _flags(args).get("--queue"), f"{name}: serve a queue"
        assert _healthy_deps(svc) >= set(nodes), f"{name}: start after the nodes are healthy"
        assert svc.get("restart") in ("always", "unless-stopped", "on-failure")
        # A worker serves no port, so the image's node probe must not judge it.
        assert (svc.get("healthcheck") or {}).get("disable") is True


def test_the_lab_is_opt_in(services: dict[str, dict[str, Any]]) -> None:
    labs = _of_role(services, "lab")
    assert len(labs) == 1
    [lab] = labs.values()
    assert lab.get("profiles") == ["lab"], "the lab runs its own cluster: opt-in profile"
    assert "http" in _health_test(lab)


def test_the_chaos_docker_backend_finds_its_default_services(
    services: dict[str, dict[str, Any]],
) -> None:
    """`chronoq chaos --backend docker` with default flags finds and reaches these services."""
    import inspect

    from chronoq.chaos import docker_backend

    defaults = inspect.signature(docker_backend.DockerBackend.__init__).parameters
    wanted = {
        docker_backend.NODE_PORT: defaults["nodes"].default,
        docker_backend.ETCD_PORT: defaults["etcd"].default,
        docker_backend.PG_PORT: tuple(defaults["postgres"].default.split(",")),
    }
    for port, names in wanted.items():
        for name in names:
            assert name in services, f"the chaos docker backend expects a service {name!r}"
            published = {_container_port(p) for p in services[name].get("ports", [])}
            assert port.split("/")[0] in published, f"{name} must publish {port}"


def test_named_volumes_network_and_restart_policies(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = set(compose["volumes"])
    used = {str(v).split(":")[0] for svc in services.values() for v in svc.get("volumes", [])}
    assert used <= declared, f"undeclared volumes {used - declared}"
    assert not any(v.startswith((".", "/")) for v in used), "state on named volumes, not binds"
    assert len(declared) >= 4, "3 etcd members and PostgreSQL"
    assert compose.get("networks")
    one_shot = _one_shot(services)
    for name, svc in services.items():
        if name in one_shot:  # it ends: restarting it would run it again and again
            assert svc.get("restart") == "no", name
        else:
            assert svc.get("restart") in ("always", "unless-stopped", "on-failure"), name
        assert svc.get("networks"), f"{name}: on the project network"
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} binds beyond loopback"


# --------------------------------------------------------------------------- Dockerfile


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        instruction, _, args = (pending + stripped).partition(" ")
        out.append((instruction.upper(), " ".join(args.split())))
        pending = ""
    return out


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics, enough for this repo: last matching pattern wins."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        if any(fnmatch(p, pat) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerfile_non_root_chronoq_entrypoint_and_health_check() -> None:
    steps = _instructions(DOCKERFILE.read_text())
    args = {}
    for instruction, rest in steps:
        if instruction == "FROM":
            break
        if instruction == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
    froms = [i for i, (instruction, _) in enumerate(steps) if instruction == "FROM"]
    final = steps[froms[-1] :]
    base = _VARIABLE.sub(lambda m: args.get(m.group(1), ""), final[0][1].split()[0])
    assert base == BASE_IMAGE
    assert any(i == "RUN" and re.search(r"pip install (\S+ )*\.(\s|$)", r) for i, r in steps), (
        "install the project with `pip install .`"
    )

    users = [rest for instruction, rest in final if instruction == "USER"]
    assert users, "the final stage must switch to a non-root USER"
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]

    entry = [rest for instruction, rest in final if instruction == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["chronoq"], 'ENTRYPOINT ["chronoq"] (exec form)'

    health = [rest for instruction, rest in final if instruction == "HEALTHCHECK"]
    assert health and " CMD " in f" {health[-1]} ", health
    probe = json.loads(health[-1].split(" CMD ", 1)[1])
    copied = {
        rest.split()[-1]: rest.split()[-2]
        for instruction, rest in final
        if instruction == "COPY" and "--from" not in rest
    }
    assert probe[-1] in copied and copied[probe[-1]] == "docker/healthcheck.py", (
        f"the health check runs {probe[-1]}, which the image must COPY from docker/"
    )

    exposed = {
        p.split("/")[0]
        for instruction, rest in final
        if instruction == "EXPOSE"
        for p in rest.split()
    }
    assert {"7070", "9464"} <= exposed

    # What is copied exists and the build context (after .dockerignore) carries it.
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for instruction, rest in steps:
        if instruction == "COPY" and "--from" not in rest:
            for source in [s for s in rest.split()[:-1] if not s.startswith("--")]:
                assert (ROOT / source).exists(), f"COPY {source}: no such file"
                assert not _ignored(source, patterns), f"COPY {source}: .dockerignore drops it"
    for kept in ("pyproject.toml", "README.md", "chronoq/cli/__init__.py", "docker/healthcheck.py"):
        assert not _ignored(kept, patterns), kept
    for dropped in (".venv/bin/python", "tests/unit/test_compose.py", ".git/HEAD"):
        assert _ignored(dropped, patterns), dropped


def test_image_env_vars_are_cli_env_vars() -> None:
    """The CHRONOQ_* defaults the image sets are read by some command."""

    def envvars(command: Any) -> set[str]:
        found = {p.envvar for p in command.params if isinstance(p.envvar, str)}
        for sub in getattr(command, "commands", {}).values():
            found |= envvars(sub)
        return found

    known = envvars(_cli())
    set_in_image = set(re.findall(r"\b(CHRONOQ_[A-Z_]+)=", DOCKERFILE.read_text()))
    assert set_in_image, "the image sets CHRONOQ_HOST and friends"
    assert set_in_image <= known, f"no command reads {set_in_image - known}"


def test_compose_health_checks_run_the_probe_the_image_ships(
    services: dict[str, dict[str, Any]],
) -> None:
    shipped = {
        rest.split()[-1]
        for instruction, rest in _instructions(DOCKERFILE.read_text())
        if instruction == "COPY" and rest.split()[-2:-1] == ["docker/healthcheck.py"]
    }
    for role in ("node", "lab"):
        for name, svc in _of_role(services, role).items():
            test = _health_test(svc)
            assert test[0] == "CMD" and test[2] in shipped, f"{name}: {test}"


# --------------------------------------------------------------------------- the health probe


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chronoq_docker_healthcheck", HEALTHCHECK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None).wait()


def test_probe_passes_a_serving_node_and_fails_a_not_serving_one(
    probe: ModuleType, health_server: tuple[str, health.HealthServicer]
) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert probe.probe_grpc(address) is None
    assert probe.main(["grpc", address]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert "NOT_SERVING" in probe.probe_grpc(address)
    assert probe.main(["grpc", address]) == 1


def test_probe_fails_when_nothing_listens(
    probe: ModuleType, health_server: tuple[str, health.HealthServicer]
) -> None:
    address, _ = health_server
    closed = address.rsplit(":", 1)[0] + ":1"
    assert "UNAVAILABLE" in probe.probe_grpc(closed)
    result = subprocess.run(
        [sys.executable, str(HEALTHCHECK), "grpc", closed],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1 and "unhealthy" in result.stderr
    assert probe.main(["bogus"]) == 1


def test_probe_http_for_the_lab(probe: ModuleType) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert probe.probe_http(f"{base}/") is None
        assert probe.main(["http", f"{base}/"]) == 0
        assert probe.probe_http(f"{base}/broken") is not None
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --------------------------------------------------------------------------- secrets


def test_no_password_has_a_default() -> None:
    """Every password (and token) is a required variable: `${X:?why}`, never `${X:-default}`
    or a literal."""
    raw = yaml.safe_load(COMPOSE.read_text())
    found = 0
    for name, svc in raw["services"].items():
        env = svc.get("environment") or {}
        assert isinstance(env, dict), f"{name}: write environment as a mapping"
        for key, value in env.items():
            if "PASSWORD" in key or "TOKEN" in key:
                found += 1
                match = _VARIABLE.fullmatch(str(value))
                assert match and match.group(2) == ":?", f"{name}: {key}={value!r}"
    assert found >= 6  # the superuser, replication, the nodes' role, the REST API, Grafana
    defaults = re.findall(r"\$\{(\w*(?:PASSWORD|TOKEN)\w*):?-", COMPOSE.read_text())
    assert not defaults, f"passwords with a default: {defaults}"


def test_no_secret_on_any_command_line(services: dict[str, dict[str, Any]]) -> None:
    """Command lines are readable by every account of the host (`ps`): no password there,
    nor in a health check; DSNs carry none (the driver reads PGPASSWORD)."""
    secrets = {_stand_in(v) for v in _REQUIRED.findall(COMPOSE.read_text())}
    assert secrets
    for name, svc in services.items():
        argv = [*_command(svc), *map(str, svc.get("entrypoint") or [])]
        check = svc.get("healthcheck") or {}
        argv += [str(t) for t in check.get("test", [])]
        for arg in argv:
            assert not any(secret in arg for secret in secrets), f"{name}: {arg}"
            for dsn in re.findall(r"postgres(?:ql)?://\S+", arg):
                assert urlsplit(dsn).password is None, f"{name}: a password in {dsn}"


def test_the_nodes_role_is_made_without_superuser_powers() -> None:
    """post-bootstrap.sh creates `chronoq` (what the nodes' DSN names) owning the database,
    with its password read by psql from the environment, not given on a command line."""
    script = (ROOT / "docker" / "patroni" / "post-bootstrap.sh").read_text()
    assert "\\getenv app_password CHRONOQ_DB_PASSWORD" in script
    assert "<<'SQL'" in script  # stdin, and no shell expansion of the SQL
    assert re.search(r"CREATE ROLE chronoq LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE", script)
    assert "CREATE DATABASE chronoq OWNER chronoq" in script
    assert "REVOKE ALL ON DATABASE postgres FROM PUBLIC" in script


def test_patronis_rest_api_wants_a_password(services: dict[str, dict[str, Any]]) -> None:
    members = _of_image(services, PATRONI_IMAGE)
    for name, pg in members.items():
        env = pg["environment"]
        assert env["PATRONI_RESTAPI_USERNAME"], name
        assert env["PATRONI_RESTAPI_PASSWORD"] == _stand_in("CHRONOQ_PATRONI_API_PASSWORD")
        assert not any(str(p).endswith(":8008") for p in pg.get("ports", [])), (
            f"{name}: the REST API stays on the compose network"
        )


# --------------------------------------------------------------------------- metrics


def test_the_nodes_metrics_need_the_token_compose_gives_them(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nodes serve /metrics on 0.0.0.0 inside the network: parsed by the real CLI with
    their environment they start only with CHRONOQ_METRICS_TOKEN, which has no default."""
    from chronoq.cli.node import node_options
    from chronoq.errors import ConfigError
    from chronoq.node.metrics import scrape_token
    from chronoq.node.settings_from import settings_from

    command = _cli().commands["node"]
    nodes = _of_role(services, "node")
    assert nodes
    for name, svc in nodes.items():
        args = _command(svc)
        assert _flag(args, "--metrics-host") == "0.0.0.0", name
        env = {k: str(v) for k, v in svc["environment"].items() if k.startswith("CHRONOQ_")}
        assert env["CHRONOQ_METRICS_TOKEN"] == _stand_in("CHRONOQ_METRICS_TOKEN"), name
        for with_token in (False, True):
            for var in [v for v in os.environ if v.startswith("CHRONOQ_")]:
                monkeypatch.delenv(var)
            for var, value in env.items():
                if with_token or var != "CHRONOQ_METRICS_TOKEN":
                    monkeypatch.setenv(var, value)
            params = command.make_context("node", args[1:]).params
            if not with_token:
                with pytest.raises(ConfigError, match="add --metrics-token-file"):
                    settings_from(node_options(params))
                continue
            token = scrape_token(settings_from(node_options(params)))
            assert token is not None, name
            assert token.admits(f"Bearer {_stand_in('CHRONOQ_METRICS_TOKEN')}"), name


def test_prometheus_sends_the_token_from_a_file_it_alone_reads(
    services: dict[str, dict[str, Any]],
) -> None:
    """Its job's credentials_file is written at start from the (required) environment
    variable, on a tmpfs, with umask 077: the token is in no config file, argv or volume."""
    prometheus = services["prometheus"]
    [job] = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())[
        "scrape_configs"
    ]
    auth = job["authorization"]
    assert auth.get("type", "Bearer") == "Bearer" and "credentials" not in auth
    path = auth["credentials_file"]
    env = prometheus["environment"]
    assert env["CHRONOQ_METRICS_TOKEN"] == _stand_in("CHRONOQ_METRICS_TOKEN")
    entrypoint = [str(part) for part in prometheus["entrypoint"]]
    assert entrypoint[:2] == ["/bin/sh", "-c"], entrypoint
    script = entrypoint[2]
    assert "umask 077" in script
    assert f'printf %s "$CHRONOQ_METRICS_TOKEN" > {path}' in script
    assert 'exec /bin/prometheus "$@"' in script
    assert any(path.startswith(str(mount).rstrip("/") + "/") for mount in prometheus["tmpfs"])
    # What Prometheus runs is still its config and data flags.
    assert any(str(c).startswith("--config.file=") for c in prometheus["command"])


# --------------------------------------------------------------------------- etcd's logins

ETCD_PASSWORDS = {
    "root": "CHRONOQ_ETCD_ROOT_PASSWORD",
    "chronoq": "CHRONOQ_ETCD_PASSWORD",
    "patroni": "CHRONOQ_ETCD_PATRONI_PASSWORD",
}


def test_no_etcd_member_answers_a_foreign_page_or_host(
    services: dict[str, dict[str, Any]],
) -> None:
    """etcd's default CORS is `*` and it answers any Host: each member allows its own origin
    only and the names it is reached by (a rebound name gets 421)."""
    members = _of_image(services, ETCD_IMAGE)
    assert len(members) == 3
    for name, svc in members.items():
        flags = _flags(_command(svc))
        assert flags.get("--cors") == [f"http://{name}:2379"], (
            f"{name}: --cors {flags.get('--cors')}"
        )
        [hosts] = flags.get("--host-whitelist", [""])
        assert sorted(hosts.split(",")) == sorted([name, "etcd", "localhost", "127.0.0.1"]), name
        assert not any("*" in v for vs in flags.values() for v in vs), f"{name}: a wildcard"


def test_etcd_init_turns_auth_on_before_anything_else_uses_etcd(
    services: dict[str, dict[str, Any]],
) -> None:
    """`chronoq etcd init` runs once the members run, with the three passwords from required
    variables; every service that talks to etcd waits until it has ended well."""
    from chronoq.embedded.etcd_auth import USERS

    members = sorted(_of_image(services, ETCD_IMAGE))
    inits = _of_role(services, "etcd")
    assert list(inits) == ["etcd-init"], sorted(inits)
    init = inits["etcd-init"]
    args = _command(init)
    assert args[:2] == ["etcd", "init"], args
    assert sorted(_flag(args, "--etcd").split(",")) == [f"{m}:2379" for m in members]
    assert "--adopt-keys" not in _flags(args), "keys in a new etcd are refused by default"
    env = init["environment"]
    assert set(ETCD_PASSWORDS) == set(USERS), "a variable for each user etcd-init creates"
    for variable in ETCD_PASSWORDS.values():
        assert env[variable] == _stand_in(variable), variable
    # Started, not healthy: the members' check logs in, which may need etcd-init first.
    deps = init["depends_on"]
    assert {m: deps[m]["condition"] for m in members} == dict.fromkeys(members, "service_started")
    assert init.get("restart") == "no" and (init.get("healthcheck") or {}).get("disable")
    assert _one_shot(services) == {"etcd-init"}
    talks_to_etcd = {
        name
        for name, svc in services.items()
        if "--etcd" in _flags(_command(svc))
        or any(str(k).startswith("PATRONI_ETCD") for k in svc.get("environment") or {})
    } - {"etcd-init"}
    assert talks_to_etcd >= {*_of_role(services, "node"), *_of_image(services, PATRONI_IMAGE)}
    for name in talks_to_etcd:
        condition = services[name]["depends_on"].get("etcd-init", {}).get("condition")
        assert condition == "service_completed_successfully", f"{name}: before etcd-init ends"
    # Workers talk to the nodes, not etcd; the lab runs its own etcd (with auth) inside.
    for name, svc in {**_of_role(services, "worker"), **_of_role(services, "lab")}.items():
        assert not any(f.startswith("--etcd") for f in _flags(_command(svc))), name
        assert not any("ETCD" in str(k) for k in svc.get("environment") or {}), name


def test_every_etcd_client_logs_in_as_its_own_user(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nodes as `chronoq`, Patroni as `patroni` (each reaches its prefix only), the members'
    health check as `chronoq`; every password from a required variable, in the environment.
    The nodes' command and environment are parsed by the real CLI into their settings."""
    from chronoq.cli.node import node_options
    from chronoq.embedded.etcd_auth import CHRONOQ_USER, USERS
    from chronoq.node.settings_from import settings_from

    command = _cli().commands["node"]
    nodes = _of_role(services, "node")
    assert len(nodes) == 3
    for name, svc in nodes.items():
        args = _command(svc)
        assert _flag(args, "--etcd-user") == CHRONOQ_USER, name
        env = {k: str(v) for k, v in svc["environment"].items() if k.startswith("CHRONOQ_")}
        assert env["CHRONOQ_ETCD_PASSWORD"] == _stand_in("CHRONOQ_ETCD_PASSWORD"), name
        for var in [v for v in os.environ if v.startswith("CHRONOQ_")]:
            monkeypatch.delenv(var)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        settings = settings_from(node_options(command.make_context("node", args[1:]).params))
        assert settings.cluster is not None, name
        etcd = settings.cluster.etcd
        assert (etcd.username, etcd.password) == (CHRONOQ_USER, _stand_in("CHRONOQ_ETCD_PASSWORD"))
    patroni_yml = yaml.safe_load((ROOT / "docker" / "patroni" / "patroni.yml").read_text())
    assert patroni_yml["namespace"] == USERS["patroni"], "Patroni's keys: the patroni user's"
    for name, pg in _of_image(services, PATRONI_IMAGE).items():
        env = pg["environment"]
        assert env["PATRONI_ETCD3_USERNAME"] == "patroni", name
        assert env["PATRONI_ETCD3_PASSWORD"] == _stand_in(ETCD_PASSWORDS["patroni"]), name
    for name, svc in _of_image(services, ETCD_IMAGE).items():
        env = svc["environment"]
        assert env["ETCDCTL_USER"] == CHRONOQ_USER, name
        assert env["ETCDCTL_PASSWORD"] == _stand_in("CHRONOQ_ETCD_PASSWORD"), name


def test_no_etcd_password_has_a_default_or_a_flag(services: dict[str, dict[str, Any]]) -> None:
    """Each etcd password is required (the compose tool test shows `config` refuses to go on
    without it) and no command line carries a password flag (only `--...-password-file`)."""
    required = set(_REQUIRED.findall(COMPOSE.read_text()))
    assert set(ETCD_PASSWORDS.values()) <= required
    for name, svc in services.items():
        for flag in _flags(_command(svc)):
            assert "password" not in flag or flag.endswith("-file"), f"{name}: {flag}"


def test_the_chaos_docker_backend_logs_in_to_etcd(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the nodes do, with the password compose was started with; none set: one clear error."""
    from chronoq.chaos.docker_backend import DockerBackend
    from chronoq.embedded.etcd_auth import CHRONOQ_USER
    from chronoq.errors import ConfigError

    class Published(DockerBackend):
        def __init__(self) -> None:  # no engine here: the ports are made up
            self.etcd_services = ["etcd-1", "etcd-2"]

        def _published(self, service: str, port: str) -> str:
            return f"127.0.0.1:{23790 + int(service[-1])}"

    backend = Published()
    monkeypatch.delenv("CHRONOQ_ETCD_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match="set CHRONOQ_ETCD_PASSWORD"):
        backend.etcd_settings("prod")
    monkeypatch.setenv("CHRONOQ_ETCD_PASSWORD", "the-password")
    settings = backend.etcd_settings("prod")
    assert list(settings.endpoints) == ["127.0.0.1:23791", "127.0.0.1:23792"]
    assert (settings.username, settings.password) == (CHRONOQ_USER, "the-password")


# --------------------------------------------------------------------------- store shards


def test_a_second_store_shard_has_its_own_server_volume_and_passwords(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    shard = services["postgres-shard-1"]
    volumes = [str(v).split(":")[0] for v in shard.get("volumes", [])]
    assert volumes == ["postgres-shard-1-data"] and "postgres-shard-1-data" in compose["volumes"]
    others = {str(v).split(":")[0] for n, s in services.items() if n != "postgres-shard-1"
              for v in s.get("volumes", [])}  # fmt: skip
    assert not others & set(volumes), "the shard's data on a volume of its own"
    env = shard["environment"]
    assert env["CHRONOQ_DB_PASSWORD"] == _stand_in("CHRONOQ_DB_SHARD_1_PASSWORD")
    assert env["POSTGRES_PASSWORD"] == _stand_in("CHRONOQ_DB_SHARD_1_SUPERUSER_PASSWORD")
    assert "scram-sha-256" in env["POSTGRES_HOST_AUTH_METHOD"]
    assert "--auth-local=scram-sha-256" in env["POSTGRES_INITDB_ARGS"]
    shard_passwords = {env["CHRONOQ_DB_PASSWORD"], env["POSTGRES_PASSWORD"]}
    shard0 = services["db-1"]["environment"]
    assert not shard_passwords & {v for k, v in shard0.items() if "PASSWORD" in k}
    targets = {c["target"]: c["source"] for c in shard.get("configs", [])}
    assert compose["configs"][targets["/docker-entrypoint-initdb.d/10-chronoq-role.sh"]] == {
        "file": "./docker/postgres-shard/init-role.sh"
    }
    for port in shard.get("ports", []):
        assert str(port).startswith("127.0.0.1:")


def test_every_node_reaches_the_second_shard_with_its_own_password(
    services: dict[str, dict[str, Any]],
) -> None:
    """Each node gets --store-shard through its environment (CHRONOQ_STORE_SHARD): the DSN
    names postgres-shard-1 as the role chronoq with shard-1's password (PGPASSWORD is
    shard-0's and would be wrong there), and the node waits for the shard to be healthy."""
    for name, svc in _of_role(services, "node").items():
        dsn = urlsplit(svc["environment"]["CHRONOQ_STORE_SHARD"])
        assert (dsn.hostname, dsn.port, dsn.path) == ("postgres-shard-1", 5432, "/chronoq"), name
        assert dsn.username == "chronoq"
        assert dsn.password == _stand_in("CHRONOQ_DB_SHARD_1_PASSWORD"), name
        assert "postgres-shard-1" in _healthy_deps(svc), name
        assert "--store-shard" not in " ".join(_command(svc)), f"{name}: not on argv"


def test_the_shards_role_is_made_without_superuser_powers() -> None:
    script = (ROOT / "docker" / "postgres-shard" / "init-role.sh").read_text()
    assert "\\getenv app_password CHRONOQ_DB_PASSWORD" in script
    assert "<<'SQL'" in script
    assert re.search(r"CREATE ROLE chronoq LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE", script)
    assert "CREATE DATABASE chronoq OWNER chronoq" in script
    assert "REVOKE ALL ON DATABASE postgres FROM PUBLIC" in script
