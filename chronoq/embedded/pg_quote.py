"""SQL text quoting for the statements the embedded stack sends through psql or its admin
connection (database and role names, passwords' verifiers): no driver is at hand there to
bind parameters, and identifiers cannot be bound anyway. With ``standard_conforming_strings``
on (PostgreSQL's default since 9.1), doubling the quote is the whole escape."""

from __future__ import annotations


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier: any database or role name is safe to interpolate."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
