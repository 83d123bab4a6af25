"""Which handler serves which queue: from a module's ``HANDLERS``, or the demo handler."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from chronoq.client.context import Handler
from chronoq.client.demo import handlers_for
from chronoq.client.registry import TaskRegistry
from chronoq.errors import ConfigError


class HandlerChoiceError(ConfigError):
    """The handlers asked for cannot be found; ``option`` names what was wrong."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(message)


def import_handlers(module: str) -> dict[str, Handler]:
    """``HANDLERS = {queue: handler}`` of ``module`` (or ``HANDLERS = tasks``, a
    ``TaskRegistry``), importable from the working directory."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to you are importable
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise HandlerChoiceError("module", f"cannot import {module!r}: {exc}") from None
    handlers = getattr(mod, "HANDLERS", None)
    if isinstance(handlers, TaskRegistry) and len(handlers):
        return handlers.handlers()
    if not isinstance(handlers, dict) or not handlers:
        raise HandlerChoiceError(
            "module", f"{module} must define HANDLERS = {{'queue': handler, ...}}"
        )
    bad = [q for q, h in handlers.items() if not isinstance(q, str) or not callable(h)]
    if bad:
        raise HandlerChoiceError("module", f"{module}.HANDLERS: {bad!r} are not queue → callable")
    return handlers


def select_handlers(module: str | None, queues: Sequence[str]) -> dict[str, Handler]:
    """The handlers of ``queues`` (all of ``module``'s when none is named).

    Without a module, the demo handler serves every named queue.

    Raises:
        HandlerChoiceError: no queue and no module, or a queue the module has no handler for.
    """
    if module is None:
        if not queues:
            raise HandlerChoiceError("queue", "name the queues to serve (or give --module)")
        return handlers_for(queues)
    handlers = import_handlers(module)
    missing = [q for q in queues if q not in handlers]
    if missing:
        raise HandlerChoiceError(
            "queue",
            f"{module}.HANDLERS has no handler for {', '.join(missing)} "
            f"(it has {', '.join(handlers)})",
        )
    return {q: handlers[q] for q in queues} if queues else handlers
