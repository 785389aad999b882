"""Namespace grants: a gateway's word that an engine may write (or drop) a tenant's cache namespace.

A namespace is a digest, H(model id, KV layout tag, tenant salt) (prefix_hash.namespace_digest), and
only the gateway knows which tenant — so which salt — a request belongs to. An engine identity is
therefore bound to the salts a gateway has recently sent it, not to namespaces it names itself:

    gateway   grant = issue(key, salt, now)   with every engine request (GenerateRequest.namespace_grant)
    engine    Put / PrepareSharedPut / Drop carry a NamespaceClaim: salt, model id, layout tag, grant
    kvstore   accepts iff verify(key, salt, grant, now) and namespace_digest(model, tag, salt) == namespace

The key is shared by gateways and kvstores, never given to engines. A grant lasts GRANT_TTL_S (an
engine stores a reply's KV seconds after the request that brought the grant), so a compromised engine
can write only namespaces of tenants routed to it in the last few minutes.

    grant = version (1 byte) | expires_unix_ms (8 bytes, big endian) | HMAC-SHA256(key, label | expires | salt)[:16]
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

GRANT_TTL_S = 600.0
GRANT_BYTES = 1 + 8 + 16
MIN_KEY_BYTES = 16
_VERSION = 1
_LABEL = b"salon namespace grant v1\x00"


def load_key(path: str | Path) -> bytes:
    """A key file: hex (as `salon certs` writes it) or raw bytes; at least MIN_KEY_BYTES."""
    raw = Path(path).read_bytes().strip()
    try:
        key = bytes.fromhex(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = raw
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{Path(path).name}: a key needs at least {MIN_KEY_BYTES} bytes")
    return key


def _mac(key: bytes, expires: bytes, salt: str) -> bytes:
    return hmac.new(key, _LABEL + expires + salt.encode("utf-8"), hashlib.sha256).digest()[:16]


def issue(key: bytes, salt: str, now_unix_s: float, ttl_s: float = GRANT_TTL_S) -> bytes:
    expires = int((now_unix_s + ttl_s) * 1000).to_bytes(8, "big")
    return bytes([_VERSION]) + expires + _mac(key, expires, salt)


def verify(key: bytes, salt: str, grant: bytes, now_unix_s: float) -> str | None:
    """None if `grant` is a valid, unexpired grant for `salt`; else what is wrong with it."""
    if len(grant) != GRANT_BYTES or grant[0] != _VERSION:
        return "not a namespace grant"
    expires = grant[1:9]
    if not hmac.compare_digest(grant[9:], _mac(key, expires, salt)):
        return "not signed for this tenant salt"
    if int.from_bytes(expires, "big") < now_unix_s * 1000:
        return "expired"
    return None
