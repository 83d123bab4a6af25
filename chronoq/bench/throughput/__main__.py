"""``python -m chronoq.bench.throughput node|worker ...``: the benchmark's child processes."""

from __future__ import annotations

import sys

from chronoq.bench.throughput.children import child_main

if __name__ == "__main__":
    child_main(sys.argv[1:])
