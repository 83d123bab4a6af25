"""TLS material for gRPC (the node's API, its clients, etcd): read, checked, made credentials.

Files are read once, when a server starts or a channel is made, and checked with the standard
``ssl`` module first, so a missing file or a key that does not match its certificate is a
``ConfigError`` naming the setting, not an opaque handshake failure later.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from chronoq.errors import ConfigError

PathLike = str | Path


def read_pem(setting: str, path: PathLike) -> bytes:
    """The bytes of a PEM file; ``ConfigError`` naming ``setting`` if unreadable or not PEM."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{setting}: {path} is not a PEM file")
    return data


def _check_pair(prefix: str, cert: PathLike, key: PathLike) -> tuple[bytes, bytes]:
    cert_pem, key_pem = read_pem(f"{prefix}_cert", cert), read_pem(f"{prefix}_key", key)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{prefix}_cert/{prefix}_key: {cert} and {key} are not a certificate and its key: "
            f"{exc.reason or exc}"
        ) from exc
    return cert_pem, key_pem


def _check_ca(setting: str, path: PathLike) -> bytes:
    pem = read_pem(setting, path)
    try:
        ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise ConfigError(f"{setting}: {path} holds no usable CA certificate: {exc}") from exc
    return pem


def server_credentials(
    cert: PathLike | None, key: PathLike | None, client_ca: PathLike | None = None
) -> grpc.ServerCredentials | None:
    """TLS for a server: None without a certificate (plaintext); with ``client_ca``, mutual TLS
    (every client must present a certificate that CA signed)."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ConfigError("tls_client_ca needs tls_cert and tls_key (mutual TLS is TLS)")
        return None
    if cert is None or key is None:
        raise ConfigError("tls_cert and tls_key go together")
    cert_pem, key_pem = _check_pair("tls", cert, key)
    ca_pem = _check_ca("tls_client_ca", client_ca) if client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=ca_pem is not None
    )


def channel_credentials(
    ca: PathLike | None = None,
    cert: PathLike | None = None,
    key: PathLike | None = None,
    *,
    prefix: str = "tls",
) -> grpc.ChannelCredentials:
    """TLS for a client: trust ``ca`` (None: the system's roots); with ``cert`` and ``key``,
    present that client certificate (for servers that require mutual TLS). ``prefix`` names
    the settings in errors (``tls_ca``, ``etcd_ca``, ...)."""
    if (cert is None) != (key is None):
        raise ConfigError(f"{prefix}_cert and {prefix}_key go together")
    ca_pem = _check_ca(f"{prefix}_ca", ca) if ca is not None else None
    cert_pem, key_pem = _check_pair(prefix, cert, key) if cert and key else (None, None)
    return grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )
