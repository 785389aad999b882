"""`salon certs --out DIR`: a private CA, one certificate per internal role, and the stack's secrets.

    DIR/ca.pem, ca.key                  the CA every service trusts (ca.key stays here: it signs more)
    DIR/<role>.pem, <role>.key          role = gateway | engine | kvstore; URI SAN spiffe://salon/<role>/<name>,
                                        DNS/IP SANs for the names callers dial; server and client use
    DIR/namespace-grant.key             shared by gateways and kvstores: gateways sign namespace grants
                                        with it, kvstores check them (salon/common/namespace_grant.py)
    DIR/salt-secret.key                 gateways only: tenant salts are HMAC(secret, tenant id)

Files are written 0600 in a directory created 0700; existing files are kept (run it again to add
nothing), so `salon up` and the compose file's `certs` step can call it on every start. Certificates
last `--days` (default 825). For a production cluster, issue the same SANs from your own CA instead.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from salon.common.peer_identity import ROLES, spiffe_id

# Names each role's certificate answers to, besides localhost / 127.0.0.1: compose service names and
# the Kubernetes Service names the manifests dial (deploy/k8s).
DEFAULT_DNS_NAMES = {
    "gateway": ["gateway", "gateway.salon.svc"],
    "engine": ["engine", "engine-0", "engine-1", "engine.salon.svc"],
    "kvstore": ["kvstore", "kvstore.salon.svc"],
}
GRANT_KEY_FILE = "namespace-grant.key"
SALT_SECRET_FILE = "salt-secret.key"


@dataclass(frozen=True)
class RoleFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class StackSecrets:
    """Paths of everything `write_stack_secrets` made."""

    directory: Path
    ca_cert: Path
    roles: dict[str, RoleFiles]
    grant_key: Path
    salt_secret: Path


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path.chmod(0o600)


def make_ca(common_name: str = "salon internal CA", days: int = 825):
    """(private key, certificate) of a new self-signed CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(
    ca_key,
    ca_cert,
    uri: str | None,
    dns_names: list[str],
    ip_addresses: list[str] = ("127.0.0.1",),
    days: int = 825,
    common_name: str | None = None,
):
    """(private key, certificate) for a service: `uri` is its SPIFFE ID (None: a certificate without a
    salon identity, for tests), usable as a TLS server and client certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    if uri is not None:
        sans.append(x509.UniformResourceIdentifier(uri))
    cn = common_name or (uri.rsplit("/", 1)[-1] if uri else "salon peer")
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def write_stack_secrets(
    directory: Path, days: int = 825, extra_dns: dict[str, list[str]] | None = None
) -> StackSecrets:
    """Create (or keep) the CA, the role certificates and the secrets in `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    ca_cert_path, ca_key_path = directory / "ca.pem", directory / "ca.key"
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    else:
        ca_key, ca_cert = make_ca(days=days)
        _write_private(ca_key_path, pem_key(ca_key))
        _write_private(ca_cert_path, pem_cert(ca_cert))
    roles = {}
    for role in ROLES:
        files = RoleFiles(directory / f"{role}.pem", directory / f"{role}.key")
        if not (files.cert.exists() and files.key.exists()):
            dns = ["localhost", *DEFAULT_DNS_NAMES[role], *(extra_dns or {}).get(role, [])]
            key, cert = issue(ca_key, ca_cert, spiffe_id(role, role), dns, days=days)
            _write_private(files.key, pem_key(key))
            _write_private(files.cert, pem_cert(cert))
        roles[role] = files
    secrets_made = {}
    for name in (GRANT_KEY_FILE, SALT_SECRET_FILE):
        path = directory / name
        if not path.exists():
            _write_private(path, secrets.token_hex(32).encode() + b"\n")
        secrets_made[name] = path
    return StackSecrets(directory, ca_cert_path, roles, secrets_made[GRANT_KEY_FILE], secrets_made[SALT_SECRET_FILE])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="salon certs", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the CA, certificates and secrets")
    p.add_argument("--days", type=int, default=825, help="validity of new certificates")
    for role in ROLES:
        p.add_argument(
            f"--{role}-dns",
            action="append",
            default=[],
            metavar="NAME",
            help=f"extra DNS name of the {role} certificate (repeatable)",
        )
    args = p.parse_args(argv)
    made = write_stack_secrets(args.out, args.days, {r: getattr(args, f"{r}_dns") for r in ROLES})
    print(f"certificates and secrets in {made.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
