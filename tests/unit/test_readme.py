"""The README stays a short front page: its two commands first, CI running exactly its test
commands, and every link it has pointing at a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MAX_LINES = 250
#: The two commands of the quick start: set up and run the demo, set up and run the tests.
DEMO = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/chronoq demo"
TESTS = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -q"


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.splitlines()) <= MAX_LINES


def test_the_two_commands_are_the_first_blocks() -> None:
    first, second = _shell_blocks(README)[:2]
    assert first.strip() == DEMO
    assert second.strip() == TESTS
    assert README.index("## Quick start") < README.index(DEMO)


def test_ci_runs_exactly_the_readmes_test_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert TESTS in ci.splitlines()
    # and every further pytest command CI runs is one the README names
    for line in ci.splitlines():
        if line.startswith(".venv/bin/python -m pytest"):
            assert f"`{line}`" in README, line


def test_every_relative_link_names_a_file() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links into the docs"
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, missing
