"""Listening ports that belong to one process: no port sharing, and a taken port is a start-up error.

grpc turns SO_REUSEPORT on for its listeners by default. On Linux two sockets of the same user that both
set it share a port: a second process started on the gateway's port would bind without an error and
take a share of new connections (and read their API keys). Every gRPC server here turns it off
(NO_PORT_SHARING); with it off, nobody else can bind the port, with or without SO_REUSEPORT.

A port that cannot be bound is a PortTakenError naming the port and what it was for, which the
bootstrap prints as one line before exiting non-zero.
"""

from __future__ import annotations

import errno
import socket

import grpc

NO_PORT_SHARING = ("grpc.so_reuseport", 0)


class PortTakenError(RuntimeError):
    """A port the service was told to listen on cannot be bound."""

    def __init__(self, purpose: str, host: str, port: int, reason: str):
        super().__init__(f"cannot listen on {host}:{port} for the {purpose}: {reason}")
        self.purpose = purpose
        self.host = host
        self.port = port


def bind_problem(host: str, port: int) -> str:
    """Why host:port cannot be bound, as the kernel says it (grpc's own error names no cause)."""
    if port == 0:
        return "no free port"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            return "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
    return "refused by grpc (not an address of this host?)"


def add_grpc_port(
    server: grpc.aio.Server, host: str, port: int, purpose: str, credentials: grpc.ServerCredentials | None = None
) -> int:
    """Bind `server` to host:port (TLS when `credentials`); return the bound port."""
    address = f"{host}:{port}"
    try:
        return server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as exc:
        raise PortTakenError(purpose, host, port, bind_problem(host, port)) from exc
