"""Password authentication of the embedded PostgreSQL: SCRAM verifiers made here, so a
password never appears in SQL text, a log or a command line, and trust lines of older clusters
found and replaced; the nodes' least-privilege role and the hand-over of a database that an
older chronoq made as the superuser (single server and Patroni alike).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from chronoq.embedded.pg_quote import quote_ident, quote_literal

# A pg_hba.conf line (not a comment) whose method is trust.
TRUST_LINE = re.compile(r"^(?!\s*#)(.*\S\s+)trust\b", re.MULTILINE)
_SCRAM_ITERATIONS = 4096
_SCRAM_SALT_BYTES = 16


def scram_verifier(password: str, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5803 format).

    ``ALTER ROLE ... PASSWORD '<verifier>'`` sets a password without the password itself
    appearing in any SQL text, log or command line.
    """
    salt = salt if salt is not None else secrets.token_bytes(_SCRAM_SALT_BYTES)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, _SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${_SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def role_sql(role: str, password: str) -> str:
    """Create ``role`` if missing, or make it so again: a login with ``password`` (as a SCRAM
    verifier) and no power beyond what it owns; close the maintenance databases to it.

    For psql's stdin, not its command line: the verifier would let whoever reads it pose as
    the server to the role's clients.
    """
    name = quote_ident(role)
    return (
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {quote_literal(role)}) "
        f"THEN CREATE ROLE {name}; END IF; END $$;\n"
        f"ALTER ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
        f"NOBYPASSRLS PASSWORD '{scram_verifier(password)}';\n"
        "REVOKE ALL ON DATABASE postgres FROM PUBLIC;\n"
        "REVOKE ALL ON DATABASE template1 FROM PUBLIC;\n"
    )


def give_database_sql(database: str, role: str) -> str:
    """Make ``role`` the owner of ``database``, closed to every other role but superusers."""
    return (
        f"ALTER DATABASE {quote_ident(database)} OWNER TO {quote_ident(role)}; "
        f"REVOKE ALL ON DATABASE {quote_ident(database)} FROM PUBLIC"
    )


def give_tables_sql(role: str) -> str:
    """Give every table, view and sequence of the public schema to ``role`` (run in the
    database: one migrated by an older chronoq as the superuser). Sequences owned by a table
    follow it."""
    return f"""DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT c.oid::regclass AS name FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
        AND c.relowner <> {quote_literal(role)}::regrole
        AND (c.relkind <> 'S' OR NOT EXISTS (SELECT FROM pg_depend d WHERE d.objid = c.oid
             AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')))
  LOOP EXECUTE format('ALTER TABLE %s OWNER TO %I', r.name, {quote_literal(role)}); END LOOP;
END $$"""
