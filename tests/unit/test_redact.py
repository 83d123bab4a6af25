"""Passwords are masked wherever they sit in a DSN or URL; nothing else is lost."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoq.redact import MASK, mask_dsn, mask_secret, split_password


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
