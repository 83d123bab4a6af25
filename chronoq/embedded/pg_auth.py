"""Password authentication of the embedded PostgreSQL: SCRAM verifiers made here, so a
password never appears in SQL text, a log or a command line, and trust lines of older clusters
found and replaced.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

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
