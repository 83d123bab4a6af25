"""Every code block of the documentation that a user would copy runs, against a real node, or
says why it cannot.

The rules, read from the Markdown itself (``docs/**/*.md``):

- a ``python`` block runs, unless the line before it is ``<!-- not run: REASON -->``;
- a ``sh`` or ``bash`` block runs only when the line before it is ``<!-- run -->``;
- any block may be ``<!-- run: until stopped -->``: it must still be running after a few
  seconds, and stop cleanly on SIGINT (a worker);
- every other block needs ``<!-- not run: REASON -->`` (a diagram in ``mermaid`` excepted), and
  a block that only includes a file (``--8<-- "path"``) is covered when a test names the file.

Blocks run in a fresh process with ``127.0.0.1:7070`` replaced by the node's address; a Python
block with a top-level ``await`` runs inside ``async with Client(address) as client``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from chronoq.node import Node
from tests.integration.conftest import NodeFactory

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DEFAULT_ADDRESS = "127.0.0.1:7070"
RUN_FOR_S = 8.0  # an until-stopped block must live this long, then stop on SIGINT
STOP_WITHIN_S = 20.0
BLOCK_TIMEOUT_S = 60.0
FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)")
MARK = re.compile(r"^<!--\s*(not run:\s*(?P<reason>.+?)|run(?P<until>:\s*until stopped)?)\s*-->$")
SHELLS = {"sh", "bash"}
ASYNC_PRELUDE = """\
import asyncio
from datetime import UTC, datetime, timedelta
from chronoq.client import Client
from chronoq.models import MisfirePolicy
from chronoq.recurrence import CatchUp

async def _main() -> None:
    async with Client({address!r}) as client:
{body}

asyncio.run(_main())
"""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mark: str  # "run", "until", "not run", "" (none)
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def include(self) -> str | None:
        lines = [line.strip() for line in self.code.splitlines() if line.strip()]
        if len(lines) == 1 and lines[0].startswith("--8<--"):
            return lines[0].split('"')[1]
        return None


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : j])
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mark, reason = "", ""
        if marked := MARK.match(before):
            if marked.group("reason"):
                mark, reason = "not run", marked.group("reason")
            else:
                mark = "until" if marked.group("until") else "run"
        found.append(Block(str(page.relative_to(DOCS)), i + 1, lang, body, mark, reason))
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    return [b for page in sorted(DOCS.rglob("*.md")) for b in blocks_of(page)]


def runs(block: Block) -> bool:
    if block.mark == "not run" or block.include is not None:
        return False
    return block.mark in ("run", "until") or block.lang == "python"


RUNNABLE = [b for b in all_blocks() if runs(b)]


def test_every_block_runs_or_says_why_not() -> None:
    tests_text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    unexplained, uncovered = [], []
    for b in all_blocks():
        if runs(b) or b.lang == "mermaid":
            continue
        if b.include is not None:
            if Path(b.include).stem not in tests_text:  # a test imports or opens it
                uncovered.append(f"{b.id} includes {b.include}, which no test names")
            continue
        if b.mark != "not run" or len(b.reason) < 10:
            unexplained.append(f"{b.id} ({b.lang or 'no language'})")
    blocks = all_blocks()
    skipped = sum(b.mark == "not run" for b in blocks)
    included = sum(b.include is not None for b in blocks)
    print(
        f"{len(blocks)} blocks: {len(RUNNABLE)} run here, {included} included files run by "
        f"their tests, {skipped} marked not run"
    )
    assert not unexplained, "blocks neither run nor marked <!-- not run: REASON -->: " + ", ".join(
        unexplained
    )
    assert not uncovered, "; ".join(uncovered)


def test_the_marker_parser_reads_reasons_and_rejects_unmarked_shell(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: starts a cluster of its own -->\n```sh\nchronoq dev\n```\n\n"
        "```sh\nchronoq status\n```\n\n<!-- run: until stopped -->\n```python\nx = 1\n```\n"
    )
    global DOCS
    saved, DOCS = DOCS, tmp_path
    try:
        first, second, third = blocks_of(page)
    finally:
        DOCS = saved
    assert (first.mark, first.reason) == ("not run", "starts a cluster of its own")
    assert second.mark == "" and not runs(second)  # an unmarked shell block is unexplained
    assert third.mark == "until" and runs(third)


@pytest.fixture
async def live(make_node: NodeFactory) -> Node:
    return await make_node()  # system clock: tasks come due while the block runs


def program(block: Block, address: str) -> list[str]:
    code = block.code.replace(DEFAULT_ADDRESS, address)
    if block.lang in SHELLS:
        return ["bash", "-euo", "pipefail", "-c", code]
    try:
        compile(code, block.id, "exec")
    except SyntaxError:  # a top-level await: run it inside a client
        body = "\n".join("        " + line for line in code.splitlines())
        code = ASYNC_PRELUDE.format(address=address, body=body)
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
async def test_block_runs_against_a_node(block: Block, live: Node, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CHRONOQ_ADDRESS": live.address,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
    }
    proc = await asyncio.create_subprocess_exec(
        *program(block, live.address),
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    if block.mark == "until":
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(proc.wait(), RUN_FOR_S)  # still running: serving, not crashed
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), STOP_WITHIN_S)
    else:
        try:
            out, err = await asyncio.wait_for(proc.communicate(), BLOCK_TIMEOUT_S)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = out.decode() + err.decode()
    print(text[-2000:])
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{text[-4000:]}"
    assert "Traceback" not in text, text[-4000:]
