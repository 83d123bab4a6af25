"""Masking secrets before they are shown: DSN passwords, etcd passwords, tokens.

Pure. ``mask_dsn`` masks one DSN (a setting); ``mask_text`` every DSN password in a message
(an error that quotes a DSN). Both err on the side of hiding too much: a malformed DSN may
lose more than its password in the display, never less.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

#: What a masked secret shows instead.
MASK = "***"

_URL = re.compile(r"^\s*[a-z][a-z0-9+.-]*://", re.IGNORECASE)
# A URL query parameter whose name says password (password=, sslpassword=): up to & or #.
_QUERY_PASSWORD = re.compile(r"(?i)([?&][\w.-]*password=)[^&#]*")
# libpq key=value: password=secret, or a quoted value with backslash escapes.
_KEYWORD_PASSWORD = re.compile(r"(?i)(\b[\w.-]*password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")
# In free text: where a URL starts (anywhere in a word: after a quote, a bracket, "dsn=").
_URL_ANYWHERE = re.compile(r"[a-z][a-z0-9+.-]*://", re.IGNORECASE)
# In free text, a key=value password not inside a URL query (those are ``_TEXT_QUERY``'s).
_TEXT_KEYWORD = re.compile(
    r"(?i)(?<![?&\w.-])([\w.-]*password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)"
)
# In free text, a query parameter password, even without its URL: up to & # or a space.
_TEXT_QUERY = re.compile(r"(?i)((?<=[?&])[\w.-]*password=)[^&#\s]*")


def mask_secret(value: str | None) -> str | None:
    """``MASK`` for any set secret (an etcd password, a token); None and "" stay as they are."""
    return MASK if value else value


def mask_dsn(dsn: str) -> str:
    """``dsn`` with every password masked: URL userinfo, ``password=`` query parameters and
    libpq ``key=value`` pairs.

    ``postgresql://app:pw@db/x?sslpassword=k`` -> ``postgresql://app:***@db/x?sslpassword=***``;
    ``host=db user=app password='p w'`` -> ``host=db user=app password=***``. Also fit for any
    URL with userinfo (an etcd endpoint ``http://user:pw@etcd:2379``).
    """
    match = _URL.match(dsn)
    if match is None:
        return _KEYWORD_PASSWORD.sub(rf"\1{MASK}", dsn)
    head, rest = dsn[: match.end()], dsn[match.end() :]
    return head + _QUERY_PASSWORD.sub(rf"\1{MASK}", _mask_userinfo(rest))


def mask_text(text: str) -> str:
    """``text`` (a message, an error) with the password of every DSN in it masked: URL
    userinfo and ``password=`` query parameters of each URL in it, wherever it starts in a
    word, and libpq ``password=`` pairs, quoted values included.

    ``could not connect to postgresql://u:pw@h/db: timeout`` ->
    ``could not connect to postgresql://u:***@h/db: timeout``. A URL ends at white space (a
    URL cannot hold one unescaped); a quoted key=value password may hold spaces.
    """
    words = re.split(r"(\s+)", text)
    masked = "".join(_mask_urls(w) if "://" in w else w for w in words)
    masked = _TEXT_QUERY.sub(rf"\1{MASK}", masked)
    return _TEXT_KEYWORD.sub(rf"\1{MASK}", masked)


def _mask_urls(word: str) -> str:
    """Each URL of ``word`` with its passwords masked (several may share a word: a list)."""
    at = 0
    while (found := _URL_ANYWHERE.search(word, at)) is not None:
        start = found.start()
        word = word[:start] + mask_dsn(word[start:])
        # On past this URL's userinfo: a password may itself look like ``x://``.
        userinfo_end = word.find("@", found.end())
        at = userinfo_end + 1 if userinfo_end >= 0 else found.end()
    return word


def split_password(dsn: str) -> tuple[str, str | None]:
    """A URL DSN without the password of its userinfo, and that password (None if it has none).

    To start a process with the password in its environment (``PGPASSWORD``, which libpq
    and asyncpg read) instead of on its command line, which every local account can read.
    A DSN in another form is returned whole.
    """
    parts = urlsplit(dsn)
    if not _URL.match(dsn) or parts.password is None:
        return dsn, None
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}")), unquote(parts.password)


def _mask_userinfo(rest: str) -> str:
    """Mask the password of ``user:password@host...`` (the part after ``scheme://``)."""
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    at = authority.rfind("@")
    if at < 0:
        # No userinfo by the book. A password holding an unescaped / ? or # ends the
        # authority early, so look for an @ further on too, as libpq does.
        at = rest.find("@")
        if at < 0 or ":" not in rest[:at]:
            return rest
    user, colon, _password = rest[:at].partition(":")
    if not colon:
        return rest
    return f"{user}:{MASK}{rest[at:]}"
