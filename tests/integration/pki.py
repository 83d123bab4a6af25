"""A throwaway PKI for TLS tests: a CA, a server certificate for loopback, a client certificate,
and a second, unrelated CA (the "wrong" one)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path  # SAN 127.0.0.1 and localhost; server and client use (etcd probes)
    server_key: Path
    client_cert: Path  # signed by ca
    client_key: Path
    other_ca: Path  # signed nothing here
    other_client_cert: Path  # signed by other_ca
    other_client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: Key) -> Path:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    path.chmod(0o600)
    return path


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _ca(common_name: str) -> tuple[Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    common_name: str, ca_key: Key, ca_cert: x509.Certificate, *, server: bool
) -> tuple[Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(
            x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            ]),
            critical=False,
        )
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    """Write the PKI's PEM files into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("chronoq test CA")
    other_key, other_cert = _ca("some other CA")
    server_key, server_cert = _leaf("chronoq node", ca_key, ca_cert, server=True)
    client_key, client_cert = _leaf("chronoq client", ca_key, ca_cert, server=False)
    stranger_key, stranger_cert = _leaf("stranger", other_key, other_cert, server=False)
    return Pki(
        ca=_write_cert(directory / "ca.pem", ca_cert),
        server_cert=_write_cert(directory / "server.pem", server_cert),
        server_key=_write_key(directory / "server-key.pem", server_key),
        client_cert=_write_cert(directory / "client.pem", client_cert),
        client_key=_write_key(directory / "client-key.pem", client_key),
        other_ca=_write_cert(directory / "other-ca.pem", other_cert),
        other_client_cert=_write_cert(directory / "stranger.pem", stranger_cert),
        other_client_key=_write_key(directory / "stranger-key.pem", stranger_key),
    )
