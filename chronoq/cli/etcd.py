"""``chronoq etcd init``: turn on an etcd's authentication with chronoq's users, once.

docker-compose runs it as the one-shot service ``etcd-init`` before Patroni and the nodes
start; the passwords come from the environment, never the command line.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from chronoq.cli.common import env, fail, out, text_opt
from chronoq.errors import ChronoqError
from chronoq.etcd_users import CHRONOQ_USER, PATRONI_USER, ROOT_USER

etcd_app = typer.Typer(help="Set up an etcd for chronoq (`chronoq etcd init`).")


def register(app: typer.Typer) -> None:
    """Add ``chronoq etcd init`` to ``app``."""
    app.add_typer(etcd_app, name="etcd")


#: The environment variable of each user's password.
_VARIABLES = {
    ROOT_USER: "ETCD_ROOT_PASSWORD",
    CHRONOQ_USER: "ETCD_PASSWORD",
    PATRONI_USER: "ETCD_PATRONI_PASSWORD",
}


def _password_opt(flag: str, name: str, user: str) -> Any:
    return text_opt(
        flag,
        name,
        f"Password of the etcd user {user} (give it in the environment, not here).",
        metavar="PASSWORD",
    )


@etcd_app.command("init")
def init(
    etcd: Annotated[
        str,
        typer.Option(
            "--etcd",
            envvar=env("ETCD"),
            metavar="HOST:PORT,...",
            help="etcd endpoints (any healthy member is used).",
        ),
    ],
    root_password: Annotated[
        str | None, _password_opt("--root-password", "ETCD_ROOT_PASSWORD", ROOT_USER)
    ] = None,
    etcd_password: Annotated[
        str | None,
        _password_opt("--etcd-password", "ETCD_PASSWORD", f"{CHRONOQ_USER} (the nodes')"),
    ] = None,
    patroni_password: Annotated[
        str | None, _password_opt("--patroni-password", "ETCD_PATRONI_PASSWORD", PATRONI_USER)
    ] = None,
    adopt_keys: Annotated[
        bool,
        typer.Option(
            "--adopt-keys",
            envvar=env("ETCD_ADOPT_KEYS"),
            help="Turn auth on although etcd holds keys (a deployment from before auth).",
        ),
    ] = False,
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            envvar=env("ETCD_INIT_WAIT"),
            min=0,
            max=3600,
            help="Seconds to wait for a healthy member.",
        ),
    ] = 120.0,
) -> None:
    """Create the users root, chronoq (keys under /chronoq/) and patroni (under Patroni's
    namespace) and turn etcd's authentication on; run again, it changes nothing but a
    password that differs from etcd's (root's excepted).

    Before auth is on anyone may change etcd: an etcd holding users, roles or keys that
    are not chronoq's is refused (auth stays on, nothing of theirs is adopted).

    Example: CHRONOQ_ETCD_ROOT_PASSWORD=... CHRONOQ_ETCD_PASSWORD=...
    CHRONOQ_ETCD_PATRONI_PASSWORD=... chronoq etcd init --etcd etcd-1:2379,etcd-2:2379
    """
    from chronoq.embedded.etcd_auth import ChangedBeforeAuth, RootRefused, init_auth

    given = {
        ROOT_USER: root_password, CHRONOQ_USER: etcd_password, PATRONI_USER: patroni_password
    }
    passwords = {user: password for user, password in given.items() if password}
    missing = [env(var) for user, var in _VARIABLES.items() if user not in passwords]
    if missing:
        fail(f"set {', '.join(missing)} in the environment", 2)
    endpoints = [e.strip() for e in etcd.split(",") if e.strip()]
    try:
        outcome = init_auth(endpoints, passwords, adopt_keys=adopt_keys, wait=wait)
    except RootRefused as exc:
        fail(
            f"etcd has auth on and refuses {env('ETCD_ROOT_PASSWORD')} ({exc.detail}): give "
            "the root password it was set up with"
        )
    except ChangedBeforeAuth as exc:
        fail(
            f"{exc.message}: if these are yours (a deployment from before auth), run again "
            f"with {env('ETCD_ADOPT_KEYS')}=1; otherwise rebuild etcd from empty volumes"
        )
    except ChronoqError as exc:
        fail(exc.message)
    done = "turned auth on" if outcome.enabled_now else "auth was on already"
    rotated = f"; new password for {', '.join(outcome.rotated)}" if outcome.rotated else ""
    out.print(escape(f"etcd at {outcome.url}: {done}{rotated}"))
