"""How an internal link is secured, checked once at start so a half-made config never serves.

Two modes, named by `--internal-auth` on every service:

    mtls                (default) internal servers require a client certificate signed by their
                        --tls-client-ca-file and check the caller's role (peer_identity.py); internal
                        clients present their own certificate and verify the server's
    insecure-loopback   development and tests on one host: no TLS and no identities on the internal
                        links, and every internal listener and target must be a loopback address

The public port of the gateway is not an internal link: tenants authenticate with API keys, and its
TLS (--tls-cert-file / --tls-key-file) is optional in both modes. A TLS setting that names a
certificate without its key (or the reverse), or a CA without a certificate to go with it, is refused
in either mode instead of silently serving plaintext.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Protocol

from salon.common.client_tls import ClientTLS

MTLS = "mtls"
INSECURE_LOOPBACK = "insecure-loopback"
MODES = (MTLS, INSECURE_LOOPBACK)
# The flags that put a service in the development mode (tests and benches on one host use them).
INSECURE_LOOPBACK_FLAGS = ("--internal-auth", INSECURE_LOOPBACK)


class SecurityConfigError(ValueError):
    """A security setting that must not start a server; the message names the flags."""


class ListenerSecurity(Protocol):
    """The settings of a server that check_server reads (salon.common.server.ServerConfig has them);
    named here so that this module, which the server imports, does not import the server back."""

    host: str
    internal_auth: str
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_client_ca_file: str | None


def is_loopback_host(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def target_host(target: str) -> str:
    """The host of a `host:port` target (IPv6 in brackets)."""
    host, sep, _port = target.rpartition(":")
    return host if sep else target


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise SecurityConfigError(f"--internal-auth: {mode!r} is not one of {', '.join(MODES)}")


def check_server(config: ListenerSecurity, internal: bool) -> None:
    """Refuse half TLS configs always; for an internal service, the mode's requirements."""
    check_mode(config.internal_auth)
    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
    if bool(cert) != bool(key):
        raise SecurityConfigError("--tls-cert-file and --tls-key-file go together: give both or neither")
    if ca and not cert:
        raise SecurityConfigError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file (mutual TLS)")
    if not internal:
        return
    if config.internal_auth == MTLS:
        if not (cert and key and ca):
            raise SecurityConfigError(
                "--internal-auth mtls needs --tls-cert-file, --tls-key-file and --tls-client-ca-file "
                "(or --internal-auth insecure-loopback for a development stack on this host)"
            )
        return
    if cert or ca:
        raise SecurityConfigError(
            "--internal-auth insecure-loopback serves plaintext: drop the --tls-* files, or use --internal-auth mtls"
        )
    if not is_loopback_host(config.host):
        raise SecurityConfigError(
            f"--internal-auth insecure-loopback listens on loopback only, not on --host {config.host}"
        )


def check_client(
    mode: str, tls: ClientTLS | None, flag_prefix: str, targets: Iterable[str] = (), any_target: bool = False
) -> None:
    """An internal client's settings: whole TLS files in mtls mode, loopback targets in insecure-loopback.

    flag_prefix names the flags in messages (e.g. "--kvstore-tls"); any_target: the targets are
    not known yet (DNS discovery), which insecure-loopback cannot allow."""
    check_mode(mode)
    if tls is not None and bool(tls.cert_file) != bool(tls.key_file):
        raise SecurityConfigError(f"{flag_prefix}-cert-file and {flag_prefix}-key-file go together")
    if mode == MTLS:
        if tls is None or not (tls.ca_file and tls.cert_file and tls.key_file):
            raise SecurityConfigError(
                f"--internal-auth mtls needs {flag_prefix}-ca-file, {flag_prefix}-cert-file and "
                f"{flag_prefix}-key-file (or --internal-auth insecure-loopback on one host)"
            )
        return
    if tls is not None:
        raise SecurityConfigError(f"--internal-auth insecure-loopback talks plaintext: drop the {flag_prefix}-* files")
    if any_target:
        raise SecurityConfigError("--internal-auth insecure-loopback needs fixed loopback targets, not DNS discovery")
    for target in targets:
        if not is_loopback_host(target_host(target)):
            raise SecurityConfigError(f"--internal-auth insecure-loopback: target {target} is not a loopback address")


def client_tls_or_none(
    flag_prefix: str, ca_file: str | None, cert_file: str | None, key_file: str | None, server_name: str | None = None
) -> ClientTLS | None:
    """ClientTLS from a service's flags, None when none of them is set."""
    if not (ca_file or cert_file or key_file):
        return None
    if not ca_file:
        raise SecurityConfigError(
            f"{flag_prefix}-cert-file needs {flag_prefix}-ca-file (the CA of the server's certificate)"
        )
    return ClientTLS(ca_file, cert_file, key_file, server_name)
