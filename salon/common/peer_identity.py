"""Who is calling an internal service, and whether that caller may.

Internal certificates name their holder in one URI subject alternative name, a SPIFFE ID:

    spiffe://salon/<role>/<name>        role: gateway | engine | kvstore     e.g. spiffe://salon/engine/engine-0

Mutual TLS proves the chain (the server requires a client certificate signed by --tls-client-ca-file);
this module reads the role from the verified certificate and checks it against the service's
AccessPolicy, which names, per RPC method prefix, the roles allowed to call:

    engine    salon.engine.v1.EngineService/*    gateway     (namespace salts, resume tokens)
    kvstore   salon.kvstore.v1.KVStoreService/*  engine
    any       grpc.health.v1 / reflection        any peer the TLS layer accepted

A verified certificate without an allowed role gets UNAUTHENTICATED. A caller without a certificate
never gets that far: the TLS handshake fails and the client sees UNAVAILABLE (grpc's Python server
can require client certificates or not ask for them, nothing in between).

In the insecure-loopback development mode there is no identity: the server listens on loopback only
and the policy is not applied (salon/common/server.py decides the mode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from salon.common.errors import Unauthenticated

TRUST_DOMAIN = "salon"
ROLES = ("gateway", "engine", "kvstore")
_PREFIX = f"spiffe://{TRUST_DOMAIN}/"


def spiffe_id(role: str, name: str) -> str:
    """The URI SAN of a certificate for `role` held by `name` (e.g. spiffe://salon/engine/engine-0)."""
    if role not in ROLES:
        raise ValueError(f"role: {role!r} is not one of {', '.join(ROLES)}")
    if not name or "/" in name:
        raise ValueError(f"name: {name!r} must be non-empty without '/'")
    return f"{_PREFIX}{role}/{name}"


@dataclass(frozen=True)
class PeerIdentity:
    role: str
    name: str

    @property
    def uri(self) -> str:
        return f"{_PREFIX}{self.role}/{self.name}"


def parse_spiffe_id(uri: str) -> PeerIdentity | None:
    """The identity in a salon SPIFFE ID, None for anything else (another trust domain, no role)."""
    if not uri.startswith(_PREFIX):
        return None
    role, sep, name = uri[len(_PREFIX) :].partition("/")
    if role not in ROLES or not sep or not name or "/" in name:
        return None
    return PeerIdentity(role, name)


def peer_identity(context: grpc.aio.ServicerContext) -> PeerIdentity | None:
    """The verified identity of the caller (None without TLS or without a salon SPIFFE ID)."""
    auth = context.auth_context() or {}
    ids = auth.get("peer_spiffe_id") or ()
    return parse_spiffe_id(ids[0].decode("utf-8", "replace")) if len(ids) == 1 else None


def peer_key(context: grpc.aio.ServicerContext) -> str:
    """A stable name of the caller for per-peer limits: its SPIFFE ID, else its address."""
    identity = peer_identity(context)
    return identity.uri if identity is not None else (context.peer() or "unknown")


@dataclass(frozen=True)
class AccessPolicy:
    """Which roles may call which methods; methods under no prefix are open to any TLS peer."""

    # RPC method prefix ("/package.Service/") -> the roles allowed to call its methods.
    roles_by_prefix: Mapping[str, frozenset[str]]

    def roles_for(self, method: str) -> frozenset[str] | None:
        """The roles allowed to call `method`; None when any peer the TLS layer accepted may."""
        for prefix, roles in self.roles_by_prefix.items():
            if method.startswith(prefix):
                return roles
        return None


def require_role(context: grpc.aio.ServicerContext, roles: frozenset[str], method: str) -> PeerIdentity:
    """The caller's identity if its role is allowed; Unauthenticated otherwise."""
    identity = peer_identity(context)
    if identity is None or identity.role not in roles:
        who = identity.uri if identity is not None else "a caller without a salon identity"
        allowed = " or ".join(sorted(roles))
        raise Unauthenticated(f"{method}: only {allowed} identities may call; {who} may not")
    return identity
