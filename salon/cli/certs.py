"""`salon certs --out DIR`: a private CA, one certificate per internal role, and the stack's secrets.

    DIR/ca.pem, ca.key                  the CA every service trusts (ca.key stays here: it signs more)
    DIR/<role>.pem, <role>.key          role = gateway | engine | kvstore; URI SAN spiffe://salon/<role>/<name>,
                                        DNS/IP SANs for the names callers dial; server and client use
    DIR/namespace-grant.key             shared by gateways and kvstores: gateways sign namespace grants
                                        with it, kvstores check them (salon/common/namespace_grant.py)
    DIR/salt-secret.key                 gateways only: tenant salts are HMAC(secret, tenant id)

`--role-dir ROLE=RDIR` (repeatable) also copies what one role may hold, and nothing else, into RDIR:
ca.pem, cert.pem and key.pem (its own), and its secrets (ROLE_SECRETS) — never ca.key, never another
role's key. A container or pod of that role mounts RDIR alone.

`--tenants-file PATH` writes a tenant table with one tenant, `default`, and a random API key when PATH
does not exist, and prints the key that once (a deployment has no example key to forget to replace).

Files are written 0600 in a directory created 0700; existing files are kept (run it again to add
nothing), so `salon up` and the compose file's `certs` step can call it on every start. Certificates
last `--days` (default 825). For a production cluster, issue the same SANs from your own CA instead.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
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
# The stack secrets each role holds besides its certificate and key.
ROLE_SECRETS = {"gateway": (GRANT_KEY_FILE, SALT_SECRET_FILE), "engine": (), "kvstore": (GRANT_KEY_FILE,)}


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


def write_role_dir(stack: StackSecrets, role: str, directory: Path) -> list[Path]:
    """Copy what `role` may hold into `directory` (0700): ca.pem, cert.pem, key.pem and its secrets."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    files = stack.roles[role]
    sources = {"ca.pem": stack.ca_cert, "cert.pem": files.cert, "key.pem": files.key}
    sources.update({name: stack.directory / name for name in ROLE_SECRETS[role]})
    written = []
    for name, source in sources.items():
        _write_private(directory / name, source.read_bytes())
        written.append(directory / name)
    return written


def write_first_tenant(path: Path) -> str | None:
    """A tenant table with one tenant (`default`, a random API key, its salt derived from the salt secret)
    at `path` unless one is there; returns the new key, or None when the file was kept."""
    if path.exists():
        return None
    api_key = "sk-salon-" + secrets.token_urlsafe(24)
    table = {"tenants": [{"tenant_id": "default", "api_key": api_key}]}
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_private(path, (json.dumps(table, indent=2) + "\n").encode())
    return api_key


def _role_dir(text: str) -> tuple[str, Path]:
    role, sep, directory = text.partition("=")
    if not sep or role not in ROLES or not directory:
        raise argparse.ArgumentTypeError(f"expected ROLE=DIR with ROLE one of {', '.join(ROLES)}, got {text!r}")
    return role, Path(directory)


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
    p.add_argument(
        "--role-dir",
        type=_role_dir,
        action="append",
        default=[],
        metavar="ROLE=DIR",
        help="also copy what ROLE may hold (CA certificate, its certificate and key, its secrets) into DIR",
    )
    p.add_argument(
        "--tenants-file",
        type=Path,
        default=None,
        help="write a tenant table with a random API key here unless the file exists (the key is printed once)",
    )
    args = p.parse_args(argv)
    made = write_stack_secrets(args.out, args.days, {r: getattr(args, f"{r}_dns") for r in ROLES})
    print(f"certificates and secrets in {made.directory}")
    for role, directory in args.role_dir:
        write_role_dir(made, role, directory)
        print(f"{role}: its certificate, key and secrets in {directory}")
    if args.tenants_file is not None:
        api_key = write_first_tenant(args.tenants_file)
        if api_key is not None:
            print(f"tenant 'default' in {args.tenants_file}; its API key, shown this once: {api_key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
