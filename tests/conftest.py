"""Fixtures shared by every test area."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class TLSFiles:
    """PEM files of a throw-away CA, a server certificate (localhost, 127.0.0.1) and a client certificate."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path


def _make_certs(directory: Path) -> TLSFiles:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def key():
        return ec.generate_private_key(ec.SECP256R1())

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(k, path):
        path.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))

    def write_cert(c, path):
        path.write_bytes(c.public_bytes(serialization.Encoding.PEM))

    def make_ca(cn):
        ca_key = key()
        ca = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn)).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
              .not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
        return ca_key, ca

    def leaf(ca_key, ca, cn, usage, sans):
        k = key()
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject).public_key(k.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return k, builder.sign(ca_key, hashes.SHA256())

    ca_key, ca = make_ca("salon test CA")
    _other_key, other_ca = make_ca("some other CA")
    server_key, server = leaf(ca_key, ca, "localhost", ExtendedKeyUsageOID.SERVER_AUTH,
                              [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client_key, client = leaf(ca_key, ca, "salon-client", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    files = TLSFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                     directory / "client.pem", directory / "client.key", directory / "other-ca.pem")
    write_cert(ca, files.ca_cert)
    write_cert(other_ca, files.other_ca_cert)
    write_cert(server, files.server_cert)
    write_key(server_key, files.server_key)
    write_cert(client, files.client_cert)
    write_key(client_key, files.client_key)
    return files


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> TLSFiles:
    """Certificates generated for this test session (never committed)."""
    return _make_certs(tmp_path_factory.mktemp("tls"))
