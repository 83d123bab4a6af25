"""Passwords are masked wherever they sit in a DSN or URL, or in a message quoting DSNs;
nothing else is lost."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.redact import MASK, mask_dsn, mask_secret, mask_text, split_password


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://app:hunter2@db/chronoq", f"postgresql://app:{MASK}@db/chronoq"),
        (
            "postgres://app:hunter2@db:5432/x?sslmode=verify-full",
            f"postgres://app:{MASK}@db:5432/x?sslmode=verify-full",
        ),
        ("postgresql://:hunter2@db/x", f"postgresql://:{MASK}@db/x"),
        ("postgresql://app:p%40ss@db/x", f"postgresql://app:{MASK}@db/x"),
        ("postgresql://app:p@ss@db/x", f"postgresql://app:{MASK}@db/x"),  # unescaped @
        ("postgresql://app:pa/ss@db/x", f"postgresql://app:{MASK}@db/x"),  # unescaped /
        ("postgresql://app:pa?ss@db/x", f"postgresql://app:{MASK}@db/x"),
        ("postgresql://app:pa#ss@db/x", f"postgresql://app:{MASK}@db/x"),
        ("postgresql://app:pw@h1:5432,h2:5433/x", f"postgresql://app:{MASK}@h1:5432,h2:5433/x"),
        (
            "postgresql://app@db/x?password=hunter2&sslmode=require",
            f"postgresql://app@db/x?password={MASK}&sslmode=require",
        ),
        (
            "postgresql://db/x?sslmode=require&PASSWORD=hunter2",
            f"postgresql://db/x?sslmode=require&PASSWORD={MASK}",
        ),
        (
            "postgresql://app:a@db/x?sslpassword=b#frag",
            f"postgresql://app:{MASK}@db/x?sslpassword={MASK}#frag",
        ),
        (
            "host=db user=app password=hunter2 dbname=x",
            f"host=db user=app password={MASK} dbname=x",
        ),
        ("host=db password = hunter2", f"host=db password = {MASK}"),
        ("host=db password='hun ter\\'2' dbname=x", f"host=db password={MASK} dbname=x"),
        ("password='unterminated", f"password={MASK}"),
        ("http://root:etcdpw@etcd-1:2379", f"http://root:{MASK}@etcd-1:2379"),
        # Nothing to mask: unchanged.
        ("postgresql://app@db:5432/chronoq", "postgresql://app@db:5432/chronoq"),
        ("postgresql://db/x?application_name=a@b", "postgresql://db/x?application_name=a@b"),
        ("host=db user=app dbname=x", "host=db user=app dbname=x"),
        ("etcd-1:2379,etcd-2:2379", "etcd-1:2379,etcd-2:2379"),
        ("7070", "7070"),
        ("", ""),
    ],
)
def test_masks_passwords(dsn: str, shown: str) -> None:
    assert mask_dsn(dsn) == shown


_password = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="'\\@"),
    min_size=1,
    max_size=30,
)


@given(password=_password)
def test_any_password_is_masked_exactly(password: str) -> None:
    assert mask_dsn(f"postgresql://app:{password}@db:5432/x") == (
        f"postgresql://app:{MASK}@db:5432/x"
    )
    assert mask_dsn(f"host=db password={password} dbname=x") == f"host=db password={MASK} dbname=x"
    assert mask_dsn(f"password='{password} {password}'") == f"password={MASK}"
    query = password.replace("&", "").replace("#", "") or "x"
    assert mask_dsn(f"postgresql://db/x?password={query}") == f"postgresql://db/x?password={MASK}"


def test_mask_secret() -> None:
    assert mask_secret("etcdpw") == MASK
    assert mask_secret(None) is None
    assert mask_secret("") == ""


@pytest.mark.parametrize(
    ("dsn", "without", "password"),
    [
        (
            "postgresql://postgres:pw@127.0.0.1:5432/x",
            "postgresql://postgres@127.0.0.1:5432/x",
            "pw",
        ),
        (
            "postgresql://app:p%40ss%2F@db/x?sslmode=require",
            "postgresql://app@db/x?sslmode=require",
            "p@ss/",
        ),
        ("postgresql://:pw@[::1]:5432/x", "postgresql://@[::1]:5432/x", "pw"),
        ("postgresql://app@db/x", "postgresql://app@db/x", None),
        ("host=db password=pw", "host=db password=pw", None),
    ],
)
def test_split_password(dsn: str, without: str, password: str | None) -> None:
    assert split_password(dsn) == (without, password)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "could not connect to postgresql://u:secret@h/db: connection refused",
            f"could not connect to postgresql://u:{MASK}@h/db: connection refused",
        ),
        (
            'store shard-1 ("postgresql://app:pw@db:5432/x"): timeout',
            f'store shard-1 ("postgresql://app:{MASK}@db:5432/x"): timeout',
        ),
        ("(http://root:etcdpw@etcd-1:2379)", f"(http://root:{MASK}@etcd-1:2379)"),
        (
            "a=postgresql://u:p1@h,b=postgresql://v:p2@h2 differ",
            f"a=postgresql://u:{MASK}@h,b=postgresql://v:{MASK}@h2 differ",
        ),
        ("dsn postgresql://u:x://y@h/db", f"dsn postgresql://u:{MASK}@h/db"),
        (
            "bad DSN host=db password='p w' dbname=x; try postgres://a@c/d?sslpassword=k&x=1",
            f"bad DSN host=db password={MASK} dbname=x; try postgres://a@c/d?sslpassword={MASK}&x=1",
        ),
        ("PGPASSWORD=abc is set", f"PGPASSWORD={MASK} is set"),
        ("a query ?password=abc&y=1 alone", f"a query ?password={MASK}&y=1 alone"),
        # Nothing to mask: unchanged.
        ("postgresql://h/db?application_name=a@b", "postgresql://h/db?application_name=a@b"),
        ("no DSN: user@example.com at 10:00", "no DSN: user@example.com at 10:00"),
        ("", ""),
    ],
)
def test_masks_every_password_in_a_message(text: str, shown: str) -> None:
    assert mask_text(text) == shown


# Words around the DSNs of a message: no @, no :// and no "password" (each would be a DSN).
_word = st.text(alphabet=st.sampled_from("abcxyz019:;,.()[]\"'-_/!"), min_size=1, max_size=8)
_raw_url_password = st.text(  # as typed into a URL: no white space; no @ (next strategy)
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="@"),
    min_size=1,
    max_size=30,
)
_at_url_password = st.text(  # an unescaped @ is read as the password's as long as no / ? #
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/?#"),
    min_size=1,
    max_size=30,
)
_any_password = st.text(min_size=1, max_size=30)  # anything, escaped as its DSN form wants


@st.composite
def _dsn(draw: st.DrawFn) -> tuple[str, str]:
    """A DSN in one of its forms with a generated password, and the same DSN masked."""
    form = draw(st.sampled_from(["url", "url-at", "url-escaped", "query", "kv", "kv-quoted"]))
    if form == "url":
        pw = draw(_raw_url_password)
        return f"postgresql://app:{pw}@db:5432/x", f"postgresql://app:{MASK}@db:5432/x"
    if form == "url-at":
        pw = draw(_at_url_password)
        return f"http://root:{pw}@etcd:2379", f"http://root:{MASK}@etcd:2379"
    if form == "url-escaped":
        pw = quote(draw(_any_password), safe="")
        return f"postgres://app:{pw}@db/x?sslmode=require", (
            f"postgres://app:{MASK}@db/x?sslmode=require"
        )
    if form == "query":
        pw = quote(draw(_any_password), safe="")
        return f"postgresql://db/x?password={pw}&sslmode=require", (
            f"postgresql://db/x?password={MASK}&sslmode=require"
        )
    if form == "kv":
        pw = draw(_raw_url_password.filter(lambda p: not p.startswith("'")))
        return f"host=db password={pw} dbname=x", f"host=db password={MASK} dbname=x"
    pw = draw(_any_password).replace("\\", "\\\\").replace("'", "\\'")
    return f"host=db password='{pw}' dbname=x", f"host=db password={MASK} dbname=x"


@given(dsns=st.lists(_dsn(), min_size=1, max_size=4), words=st.lists(_word, min_size=5))
def test_no_generated_password_survives_in_a_message(
    dsns: list[tuple[str, str]], words: list[str]
) -> None:
    """Each DSN between words of an error message, wrapped or not: all of them come out
    masked, exactly, and the words around them unchanged."""
    text, shown = [words[0]], [words[0]]
    for i, (dsn, masked) in enumerate(dsns):
        around = words[(i + 1) % len(words)]
        text += [dsn, around]
        shown += [masked, around]
    assert mask_text(" ".join(text)) == " ".join(shown)
    # A message quoting one DSN in a word of its own: the console's case.
    dsn, masked = dsns[0]
    assert mask_text(f"could not connect to {dsn}: refused") == (
        f"could not connect to {masked}: refused"
    )
