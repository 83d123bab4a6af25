"""Bearer tokens bound to namespaces: the token file, and who may touch which namespace
(and ``ScrapeToken``, the one token that may read a node's /metrics).

Pure: no gRPC here (``chronoq.node.edge.auth_interceptor`` applies it to calls). The token file is
TOML::

    [tokens]
    "secret-a" = ["team-a"]                 # this token reaches namespace team-a only
    "secret-b" = ["team-b", "default"]
    "sha256:2bb80d53...f5a8" = ["team-c"]   # the same, without the token itself on disk
    "admin-token" = ["*"]                   # every namespace, and cluster-wide calls (Drain)

Tokens are kept only as SHA-256 digests and looked up by digest. A dict lookup is not constant
time, but what it could leak is how much of the *digest* of a guess matches a stored digest,
which says nothing about the token (SHA-256 is preimage resistant); the token itself is never
compared. That is why no ``hmac.compare_digest`` loop over every token is needed, and why a
file may hold digests instead of secrets (``python -c "import hashlib;
print(hashlib.sha256(b'TOKEN').hexdigest())"``). Use long random tokens
(``python -c "import secrets; print(secrets.token_urlsafe(32))"``): a digest does not make a
short token safe, so a token shorter than ``MIN_TOKEN_LENGTH`` is refused. Whoever can write
the file can grant themselves every namespace, so a file writable by group or others, owned
by another account, or in a directory through which another account could replace it, is
refused too (``chronoq.private_files``: the error says which chmod or chown fixes it); one
that others can read while it holds tokens in clear is logged as a warning.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from chronoq.errors import ConfigError, InvalidArgument, NamespaceDenied, Unauthenticated
from chronoq.limits import check_name
from chronoq.models import DEFAULT_NAMESPACE
from chronoq.private_files import check_file

log = logging.getLogger("chronoq.auth")

#: The namespace entry that grants every namespace and cluster-wide calls.
ALL_NAMESPACES = "*"
#: Shortest token a token file may hold in clear: a short token can be guessed.
MIN_TOKEN_LENGTH = 16
#: The largest token file read: a table of tokens, not a document.
MAX_TOKEN_FILE_BYTES = 1 << 20
_DIGEST_PREFIX = "sha256:"


def token_digest(token: str) -> bytes:
    """The SHA-256 digest under which a token is stored."""
    return hashlib.sha256(token.encode()).digest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header value, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


@dataclass(frozen=True)
class Grant:
    """What one token may reach."""

    namespaces: frozenset[str]
    label: str  # the first hex digits of the token's digest: names it in logs, reveals nothing

    @property
    def admin(self) -> bool:
        return ALL_NAMESPACES in self.namespaces

    def allows(self, namespace: str) -> bool:
        return self.admin or (namespace or DEFAULT_NAMESPACE) in self.namespaces


class TokenAuth:
    """Tokens and their namespaces; ``authenticate`` a token, then ``authorize`` a request."""

    def __init__(self, tokens: Mapping[str, Iterable[str]], *, source: str = "tokens") -> None:
        """Args:
        tokens: token (or ``sha256:<hex digest>``) -> namespaces (``*`` for all).
        source: where they came from, for error messages.
        """
        self._grants: dict[bytes, Grant] = {}
        self.clear_tokens = 0  # tokens given in clear rather than as sha256: digests
        for key, namespaces in tokens.items():
            digest = _digest_of_key(key, source)
            if digest in self._grants:
                raise ConfigError(f"{source}: token {_label(digest)} is listed twice")
            label = _label(digest)
            granted = _namespaces(namespaces, f"{source}: token {label}")
            clear = not key.startswith(_DIGEST_PREFIX)
            if clear and len(key) < MIN_TOKEN_LENGTH:
                raise ConfigError(
                    f"{source}: token {label} (for {', '.join(sorted(granted))}) is shorter "
                    f"than {MIN_TOKEN_LENGTH} characters: replace it with a long random one "
                    '(python -c "import secrets; print(secrets.token_urlsafe(32))")'
                )
            self._grants[digest] = Grant(granted, label)
            self.clear_tokens += 1 if clear else 0
        if not self._grants:
            raise ConfigError(f"{source}: no tokens: every call would be refused")

    def __len__(self) -> int:
        return len(self._grants)

    @classmethod
    def from_toml(cls, text: str, *, source: str = "token file") -> TokenAuth:
        """Parse the ``[tokens]`` table of a TOML document."""
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
        table = doc.get("tokens")
        if not isinstance(table, dict):
            raise ConfigError(f'{source}: needs a [tokens] table: "token" = ["namespace", ...]')
        return cls(table, source=source)

    @classmethod
    def from_file(cls, path: str | Path) -> TokenAuth:
        """Read a token file (see the module docstring); refuse one that another account
        could rewrite or replace. The checks look at the open file, so what was checked is
        what is read."""
        try:
            # O_NONBLOCK: a FIFO put in the file's place must not hang the node's start.
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
                st = os.fstat(file.fileno())
                check_file(Path(path), st, "auth_tokens")
                data = file.read(MAX_TOKEN_FILE_BYTES + 1)
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"auth_tokens: cannot read {path}: {exc}") from exc
        if len(data) > MAX_TOKEN_FILE_BYTES:
            raise ConfigError(f"auth_tokens: {path} is over {MAX_TOKEN_FILE_BYTES} bytes")
        mode = st.st_mode
        auth = cls.from_toml(text, source=str(path))
        if mode & (stat.S_IRGRP | stat.S_IROTH) and auth.clear_tokens:
            log.warning(
                "token file %s is readable by group or others and holds %d tokens in clear: "
                "chmod 600 it, or keep sha256: digests instead of tokens",
                path,
                auth.clear_tokens,
            )
        return auth

    def authenticate(self, token: str | None) -> Grant:
        """The grant of ``token``; ``Unauthenticated`` if it is missing or unknown."""
        if not token:
            raise Unauthenticated("missing bearer token: pass --token / CHRONOQ_TOKEN")
        grant = self._grants.get(token_digest(token))
        if grant is None:
            raise Unauthenticated("unknown bearer token")
        return grant

    @staticmethod
    def authorize(grant: Grant, namespaces: Iterable[str] | None, method: str = "") -> None:
        """Raise ``NamespaceDenied`` unless ``grant`` reaches every namespace of a request.

        ``namespaces`` None means a cluster-wide call (no namespace in the request), which only
        a ``*`` token may make.
        """
        if namespaces is None:
            if not grant.admin:
                raise NamespaceDenied(None, method)
            return
        for namespace in sorted(namespaces):
            if not grant.allows(namespace):
                raise NamespaceDenied(namespace or DEFAULT_NAMESPACE, method)


class TokenFile:
    """A token file that is re-read when it changes, so tokens rotate without a restart.

    ``current()`` looks at the file (one ``stat``) at most once per ``interval``, on use; a
    changed file that no longer parses keeps the tokens in force and logs why, because a typo
    in the file must not lock every client out. The file must be valid at start.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self._interval = interval
        self._monotonic = monotonic
        self._auth = TokenAuth.from_file(self.path)
        self._stamp = self._stat()
        self._checked = monotonic()
        self.reloads = 0

    def current(self) -> TokenAuth:
        """The tokens in force (reloaded first if the file changed and the check is due)."""
        now = self._monotonic()
        if now - self._checked >= self._interval:
            self._checked = now
            self._reload_if_changed()
        return self._auth

    def _stat(self) -> tuple[int, int, int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        # The mode and owner too: a chmod or chown that opens the file to others is seen (and
        # refused) at once.
        return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid)

    def _reload_if_changed(self) -> None:
        stamp = self._stat()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        if stamp is None:
            log.error(
                "token file %s is gone: keeping the %d tokens in force", self.path, len(self._auth)
            )
            return
        try:
            auth = TokenAuth.from_file(self.path)
        except ConfigError as exc:
            log.error(
                "token file changed but is not usable, keeping the %d tokens in force: %s",
                len(self._auth),
                exc,
            )
            return
        self._auth = auth
        self.reloads += 1
        log.info("token file %s reloaded: %d tokens", self.path, len(auth))


class ScrapeToken:
    """The one bearer token that may read a node's /metrics (a scraper is no tenant: it gets
    no namespaces). Given as the token or as ``sha256:<hex digest>``, like a token file's keys;
    a request's token is hashed and its digest compared in constant time."""

    def __init__(self, text: str, *, source: str = "metrics token") -> None:
        self._digest = _digest_of_key(text, source)
        if not text.startswith(_DIGEST_PREFIX) and len(text) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"{source}: the token is shorter than {MIN_TOKEN_LENGTH} characters: replace "
                'it with a long random one (python -c "import secrets; '
                'print(secrets.token_urlsafe(32))")'
            )
        self.label = _label(self._digest)

    def admits(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value carries this token as a bearer token."""
        token = bearer_token(authorization)
        return token is not None and hmac.compare_digest(token_digest(token), self._digest)

    def __repr__(self) -> str:
        return f"ScrapeToken({self.label})"


def _label(digest: bytes) -> str:
    return f"sha256:{digest.hex()[:8]}…"


def _digest_of_key(key: object, source: str) -> bytes:
    if not isinstance(key, str) or not key.strip() or key != key.strip() or " " in key:
        raise ConfigError(f"{source}: a token must be a non-empty string without spaces")
    if not key.startswith(_DIGEST_PREFIX):
        return token_digest(key)
    hex_digest = key.removeprefix(_DIGEST_PREFIX)
    try:
        digest = bytes.fromhex(hex_digest)
    except ValueError:
        digest = b""
    if len(digest) != hashlib.sha256().digest_size:
        raise ConfigError(f"{source}: {key[:16]}… is not sha256: and 64 hex digits")
    return digest


def _namespaces(value: object, where: str) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f'{where}: namespaces must be a list, e.g. ["team-a"]')
    names: set[str] = set()
    for name in value:
        if name == ALL_NAMESPACES:
            names.add(name)
            continue
        if not isinstance(name, str):
            raise ConfigError(f"{where}: namespace {name!r} is not a string")
        try:
            names.add(check_name("namespace", name))
        except InvalidArgument as exc:
            raise ConfigError(f"{where}: {exc.message}") from exc
    if not names:
        raise ConfigError(f"{where}: grants no namespace")
    return frozenset(names)
