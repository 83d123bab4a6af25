"""etcd's users, roles and auth switch, set up over its JSON gateway (``/v3/auth/...``).

One procedure for every etcd chronoq starts: the embedded one (``chronoq.embedded.etcd``) and
docker-compose's (``chronoq etcd init``, its one-shot ``etcd-init`` service). ``enable_auth``
adds the users of ``USERS`` with the passwords it is given, each with a role that reads and
writes its own key prefix only (root: everything), and turns authentication on: from then on
etcd refuses a request without a token. Before auth is on anyone who reaches the port may
write, users and keys included, so once it is on every user, role and permission is checked
to be exactly ours, and an etcd that should be new to hold no key: what someone slipped in
before is refused, not adopted, and the verdict is kept in etcd (root's key ``STATE_KEY``), so
every later run refuses it too. Every step is idempotent: the next run completes one that was
cut short.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chronoq.embedded.ha.config import NAMESPACE as PATRONI_NAMESPACE
from chronoq.errors import ChronoqError, ConfigError
from chronoq.etcd_users import CHRONOQ_USER, PATRONI_USER, ROOT_USER

__all__ = [
    "CHRONOQ_USER",
    "STATE_KEY",
    "USERS",
    "ChangedBeforeAuth",
    "EtcdAuthError",
    "Gateway",
    "GatewayError",
    "GatewayUnreachable",
    "InitOutcome",
    "RootRefused",
    "authenticate",
    "check_users",
    "enable_auth",
    "init_auth",
    "rotate_passwords",
]

#: The users of a chronoq etcd and the key prefix each may read and write (root: all).
USERS: dict[str, str | None] = {
    ROOT_USER: None,
    CHRONOQ_USER: "/chronoq/",
    PATRONI_USER: PATRONI_NAMESPACE,
}

#: Where root keeps the verdict on the users and keys found when auth was turned on (no
#: user's prefix covers it).
STATE_KEY = b"/chronoq-auth-state"
#: The largest gateway answer read: users, roles, a key count (never a range of keys).
MAX_REPLY_BYTES = 1 << 20
#: The largest error body read back for its message.
_MAX_ERROR_BYTES = 16 << 10
_NOT_ENABLED = "authentication is not enabled"
_BAD_PASSWORD = "authentication failed"
# Never let http_proxy and friends see the passwords.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EtcdAuthError(ChronoqError):
    """etcd's authentication could not be set up."""


class GatewayError(EtcdAuthError):
    """etcd refused a call of its JSON gateway (the message is etcd's)."""


class GatewayUnreachable(EtcdAuthError):
    """etcd's JSON gateway did not answer."""


class RootRefused(EtcdAuthError):
    """etcd has auth on but refuses root's password: it was set up with another one."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"etcd has auth on but refuses root's password ({detail})")


class ChangedBeforeAuth(EtcdAuthError):
    """Someone changed etcd (users, roles, permissions or keys) before its auth was on."""

    def __init__(self, found: Sequence[str]) -> None:
        self.found = list(found)
        super().__init__(
            f"etcd was changed by someone else before its auth was on ({'; '.join(found)})"
        )


class Gateway:
    """One etcd member's JSON gateway: ``gateway(path, body, token)`` POSTs and answers JSON."""

    def __init__(
        self,
        url: str,
        *,
        opener: urllib.request.OpenerDirector | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._opener = opener or _HTTP
        self._timeout = timeout

    def __repr__(self) -> str:
        return f"Gateway({self.url!r})"

    def __call__(self, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        """POST ``body`` to ``path``; etcd's refusal as ``GatewayError``.

        Raises:
            GatewayError: etcd answered with an error.
            GatewayUnreachable: no answer, or not one of etcd's.
        """
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = token
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                raw = response.read(MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise GatewayError(_etcd_message(exc)) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise GatewayUnreachable(f"etcd gateway {self.url}{path} failed: {exc}") from exc
        if len(raw) > MAX_REPLY_BYTES:
            raise GatewayUnreachable(f"etcd gateway {self.url}{path}: over {MAX_REPLY_BYTES} B")
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise GatewayUnreachable(f"etcd gateway {self.url}{path}: not JSON") from exc
        return data if isinstance(data, dict) else {}

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether the member says ``/health`` is true: it has a leader and serves a quorum
        read (etcd answers this without a token, auth on or off)."""
        try:
            with self._opener.open(f"{self.url}/health", timeout=timeout) as response:
                data = json.loads(response.read(MAX_REPLY_BYTES))
        except (OSError, ValueError, http.client.HTTPException):
            return False
        return isinstance(data, dict) and data.get("health") == "true"


def _etcd_message(exc: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(exc.read(_MAX_ERROR_BYTES))
    except (OSError, ValueError, http.client.HTTPException):
        return str(exc.reason)
    message = (data.get("error") or data.get("message")) if isinstance(data, dict) else None
    return str(message or exc.reason)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix`` (etcd's convention)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _prefix_perm(prefix: str) -> dict[str, str]:
    return {"key": _b64(prefix.encode()), "range_end": _b64(_prefix_end(prefix.encode()))}


def _role(user: str) -> str:
    return ROOT_USER if USERS[user] is None else user


def _unless_exists(gateway: Gateway, path: str, body: dict[str, Any]) -> bool:
    """``gateway(path, body)``; False instead of the error when what it adds is there already."""
    try:
        gateway(path, body)
    except GatewayError as exc:
        if "already" not in exc.message:
            raise
        return False
    return True


def _checked(passwords: Mapping[str, str]) -> Mapping[str, str]:
    missing = [user for user in USERS if not passwords.get(user)]
    if missing:
        raise ConfigError(f"no etcd password for {', '.join(missing)}")
    return passwords


def authenticate(gateway: Gateway, user: str, password: str) -> str:
    """A token of ``user`` (``GatewayError`` if etcd refuses the password or has no auth)."""
    token = gateway("/v3/auth/authenticate", {"name": user, "password": password}).get("token")
    if not token:
        raise GatewayUnreachable(f"etcd gateway {gateway.url} gave {user} no token")
    return str(token)


def enable_auth(gateway: Gateway, passwords: Mapping[str, str], *, fresh: bool) -> bool:
    """Turn auth on with ``USERS`` and ``passwords`` unless it is on; True if it was turned on
    now, False if root's password already works.

    Args:
        gateway: Any member of the etcd.
        passwords: A password for each user of ``USERS``.
        fresh: The etcd should hold no key yet (it is new): refuse one that does.

    Raises:
        RootRefused: auth is on already, with another root password.
        ChangedBeforeAuth: a user, role or permission that is not ours, or a key in a fresh
            etcd; auth is on then, and nothing of the intruder's was adopted. Every later
            call raises it again.
        ConfigError: a user of ``USERS`` has no password.
        GatewayError, GatewayUnreachable: etcd refused a step or did not answer.
    """
    _checked(passwords)
    try:
        token = authenticate(gateway, ROOT_USER, passwords[ROOT_USER])
    except GatewayError as exc:
        if _NOT_ENABLED not in exc.message:
            if _BAD_PASSWORD in exc.message:
                raise RootRefused(exc.message) from exc
            raise
    else:  # on already, with our root password: as checked then, or checked now
        _settle(gateway, token, fresh=fresh)
        return False
    for user, prefix in USERS.items():
        role = _role(user)
        if prefix is not None:
            _unless_exists(gateway, "/v3/auth/role/add", {"name": role})
            perm = {"permType": "READWRITE", **_prefix_perm(prefix)}
            gateway("/v3/auth/role/grant", {"name": role, "perm": perm})
        body = {"name": user, "password": passwords[user]}
        if not _unless_exists(gateway, "/v3/auth/user/add", body):
            gateway("/v3/auth/user/changepw", body)  # someone else's user of that name: ours now
        _unless_exists(gateway, "/v3/auth/user/grant", {"user": user, "role": role})
    gateway("/v3/auth/enable", {})
    _settle(gateway, authenticate(gateway, ROOT_USER, passwords[ROOT_USER]), fresh=fresh)
    return True


def _settle(gateway: Gateway, token: str, *, fresh: bool) -> None:
    """The verdict of ``check_users`` once, kept under ``STATE_KEY`` (root's only): a run cut
    short before it, or the run after a refusal, must not take the etcd as it is."""
    state = gateway("/v3/kv/range", {"key": _b64(STATE_KEY)}, token).get("kvs", [])
    if state:
        try:
            verdict = json.loads(base64.b64decode(state[0].get("value", "")))
        except ValueError:
            verdict = None
        if not isinstance(verdict, dict):
            raise ChangedBeforeAuth([f"an unreadable {STATE_KEY.decode()}"])
        if verdict.get("refused"):
            raise ChangedBeforeAuth([str(f) for f in verdict["refused"]])
        return
    found = check_users(gateway, token, fresh=fresh)
    verdict = {"refused": found} if found else {"checked": True}
    put = {"key": _b64(STATE_KEY), "value": _b64(json.dumps(verdict).encode())}
    gateway("/v3/kv/put", put, token)
    if found:
        raise ChangedBeforeAuth(found)


def check_users(gateway: Gateway, token: str, *, fresh: bool) -> list[str]:
    """What is not exactly ``USERS``' in etcd's users, roles and permissions (and, if
    ``fresh``, its keys): what someone changed before its auth was on, each thing named."""
    found: list[str] = []
    users = gateway("/v3/auth/user/list", {}, token).get("users", [])
    if sorted(users) != sorted(USERS):
        found.append(f"users {sorted(users)}")
    for user in sorted(set(users) | set(USERS)):
        roles = gateway("/v3/auth/user/get", {"name": user}, token).get("roles", [])
        if roles != ([_role(user)] if user in USERS else []):
            found.append(f"{user} has roles {roles}")
    roles = gateway("/v3/auth/role/list", {}, token).get("roles", [])
    if sorted(roles) != sorted(u for u, p in USERS.items() if p is not None):
        found.append(f"roles {sorted(roles)}")
    for user, prefix in USERS.items():
        if prefix is None:
            continue
        perms = gateway("/v3/auth/role/get", {"role": user}, token).get("perm", [])
        want = _prefix_perm(prefix)
        if [{k: p.get(k) for k in want} for p in perms] != [want]:
            found.append(f"role {user} has permissions {perms}")
    if fresh:
        everything = {"key": _b64(b"\0"), "range_end": _b64(b"\0"), "count_only": True}
        keys = int(gateway("/v3/kv/range", everything, token).get("count", 0))
        if keys:
            found.append(f"{keys} keys in a new etcd")
    return found


def rotate_passwords(gateway: Gateway, passwords: Mapping[str, str]) -> list[str]:
    """Give each user but root the password of ``passwords`` where etcd holds another (a
    password changed in the environment); the users changed. A user whose password already
    works is left alone: a change would end every token of theirs.

    Raises:
        RootRefused: etcd refuses root's password (root's own is changed with etcdctl).
    """
    _checked(passwords)
    changed: list[str] = []
    for user in USERS:
        if user == ROOT_USER:
            continue
        try:
            authenticate(gateway, user, passwords[user])
            continue
        except GatewayError as exc:
            if _BAD_PASSWORD not in exc.message:
                raise
        try:
            token = authenticate(gateway, ROOT_USER, passwords[ROOT_USER])
        except GatewayError as exc:
            raise RootRefused(exc.message) from exc
        gateway("/v3/auth/user/changepw", {"name": user, "password": passwords[user]}, token)
        changed.append(user)
    return changed


@dataclass(frozen=True)
class InitOutcome:
    """What ``init_auth`` did: the member it used, whether it turned auth on, whom it gave a
    new password."""

    url: str
    enabled_now: bool
    rotated: list[str]


def _url(endpoint: str) -> str:
    return endpoint if "://" in endpoint else f"http://{endpoint}"


def init_auth(
    endpoints: Sequence[str],
    passwords: Mapping[str, str],
    *,
    adopt_keys: bool = False,
    wait: float = 120.0,
) -> InitOutcome:
    """Set up the auth of the etcd at ``endpoints`` (``host:port``), as a deployment's one-shot
    step before anything else uses it (docker-compose's ``etcd-init``).

    Waits up to ``wait`` seconds for a member to be healthy, then turns auth on as
    ``enable_auth`` does, refusing an etcd that holds keys unless ``adopt_keys`` (those of a
    deployment from before auth); when auth is on already it gives the users the passwords
    of ``passwords`` where etcd holds others.

    Raises:
        GatewayUnreachable: no member healthy within ``wait``.
        and what ``enable_auth`` and ``rotate_passwords`` raise.
    """
    _checked(passwords)
    if not endpoints:
        raise ConfigError("no etcd endpoints")
    gateways = [Gateway(_url(endpoint)) for endpoint in endpoints]
    deadline = time.monotonic() + wait
    while True:
        gateway = next((g for g in gateways if g.healthy()), None)
        if gateway is not None:
            break
        if time.monotonic() >= deadline:
            raise GatewayUnreachable(
                f"no etcd member of {', '.join(endpoints)} healthy within {wait:g}s"
            )
        time.sleep(0.5)
    enabled = enable_auth(gateway, passwords, fresh=not adopt_keys)
    rotated = [] if enabled else rotate_passwords(gateway, passwords)
    return InitOutcome(gateway.url, enabled, rotated)
