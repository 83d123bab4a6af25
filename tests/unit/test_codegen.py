"""The committed protobuf stubs must match the .proto files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chronoq.api import codegen

# Lines that name the generator's version: a newer grpcio-tools may change them alone.
_VERSIONED = re.compile(
    r"(^# Protobuf Python Version:.*$|^_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)"
    r"|^GRPC_GENERATED_VERSION = .*$)",
    re.MULTILINE,
)


def _normalized(path: Path) -> str:
    return _VERSIONED.sub("", path.read_text())


def test_stubs_are_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    written = codegen.generate(tmp_path)
    assert written, "no stubs generated"
    for fresh in written:
        committed = codegen.OUT_DIR / fresh.name
        assert committed.exists(), f"{committed} is missing: run python -m chronoq.api.codegen"
        assert _normalized(committed) == _normalized(fresh), (
            f"{committed.name} is stale: run python -m chronoq.api.codegen"
        )
    stale = {p.name for p in codegen.OUT_DIR.glob("*_pb2*")} - {p.name for p in written}
    assert not stale, f"stubs without a .proto: {stale}"

