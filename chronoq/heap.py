"""The long-lived heap of a server process, out of the cyclic collector's way.

CPython's full collections walk every tracked object. A node or worker process holds a few
hundred thousand of them from its imports and startup (modules, gRPC and driver state) that
live as long as the process, and walking them costs a full collection tens of milliseconds
on a busy machine: a pause that every task due meanwhile waits out. Freezing what is alive
once the process serves (``gc.freeze``) leaves later collections only what it allocated
since. An object frozen here that later becomes part of an unreachable cycle is never
collected, so this is for the startup heap of a long-running process only, called once.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect what startup left behind, then move every live object to the permanent
    generation (``gc.freeze``)."""
    gc.collect()
    gc.freeze()
