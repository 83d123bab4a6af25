"""Regenerate the protobuf/gRPC stubs in ``chronoq/api/v1`` from ``proto/chronoq/v1``.

The stubs are committed so that installing chronoq needs no code generator; the test
``tests/unit/test_codegen.py`` regenerates them into a temporary folder and fails when
the committed copies are stale. Run ``python -m chronoq.api.codegen`` after editing a
``.proto`` file.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
OUT_DIR = Path(__file__).resolve().parent / "v1"
_IMPORT = re.compile(r"^from chronoq\.v1 import", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Generate the stubs into ``out_dir``; returns the files written."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # developers only

    protos = sorted((PROTO_DIR / "chronoq" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        include = str(Path(protoc.__file__).parent / "_proto")
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(p) for p in protos],
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / "chronoq" / "v1").iterdir()):
            text = _IMPORT.sub("from chronoq.api.v1 import", src.read_text())
            dst = out_dir / src.name
            dst.write_text(text)
            written.append(dst)
        (out_dir / "__init__.py").write_text('"""Generated stubs: do not edit."""\n')
        written.append(out_dir / "__init__.py")
    return written


if __name__ == "__main__":
    for path in generate(OUT_DIR):
        print(path.relative_to(ROOT), file=sys.stderr)
