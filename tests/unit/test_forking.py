"""gRPC's fork handlers go off where servers are started, and only there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from chronoq.forking import FORK_SUPPORT_VARIABLE


def _run(probe: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != FORK_SUPPORT_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_embedded_servers_switch_the_handlers_off_before_grpc_loads() -> None:
    seen = _run(
        "import json, os, sys\n"
        "import chronoq.embedded\n"
        f"print(json.dumps({{'value': os.environ.get({FORK_SUPPORT_VARIABLE!r}),"
        " 'grpc': 'grpc' in sys.modules}))\n"
    )
    assert seen == {"value": "false", "grpc": False}


def test_too_late_once_grpc_is_loaded_and_an_explicit_setting_wins() -> None:
    seen = _run(
        "import json, os\n"
        "import grpc\n"
        "from chronoq.forking import disable_grpc_fork_handlers\n"
        "print(json.dumps({'in_time': disable_grpc_fork_handlers()}))\n"
    )
    assert seen == {"in_time": False}
    explicit = _run(
        "import json, os\n"
        f"os.environ[{FORK_SUPPORT_VARIABLE!r}] = 'true'\n"
        "from chronoq.forking import disable_grpc_fork_handlers\n"
        f"print(json.dumps({{'in_time': disable_grpc_fork_handlers(),"
        f" 'value': os.environ[{FORK_SUPPORT_VARIABLE!r}]}}))\n"
    )
    assert explicit == {"in_time": True, "value": "true"}
