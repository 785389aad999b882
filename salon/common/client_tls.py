"""TLS settings of an internal client: the CA that signed the server, and our own certificate for mutual TLS."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class ClientTLS:
    """TLS settings of a client: the CA that signed the server, and our own certificate for mutual TLS."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    server_name_override: str | None = None


def client_credentials(tls: ClientTLS) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=Path(tls.ca_file).read_bytes(),
        private_key=Path(tls.key_file).read_bytes() if tls.key_file else None,
        certificate_chain=Path(tls.cert_file).read_bytes() if tls.cert_file else None,
    )


def tls_options(tls: ClientTLS | None) -> list[tuple[str, object]]:
    return [("grpc.ssl_target_name_override", tls.server_name_override)] if tls and tls.server_name_override else []
