"""The startup heap leaves the cyclic collector's sight once, in a long-running process."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap


def test_freezing_moves_the_live_heap_out_of_later_collections() -> None:
    # In a child: freezing is for a whole process's life, and must not leak into this one.
    code = textwrap.dedent(
        """
        import gc
        from chronoq.heap import freeze_startup_heap
        startup = [[] for _ in range(10_000)]  # live at startup
        freeze_startup_heap()
        assert gc.get_freeze_count() >= 10_000, gc.get_freeze_count()
        later = [[] for _ in range(100)]
        assert sum(gc.get_count()) < 10_000  # what a collection walks now: the new objects
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
    assert gc.get_freeze_count() == 0  # this process untouched
