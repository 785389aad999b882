"""Tenants: who is calling, which cache namespace they get, and their limits.

A tenant file (JSON or TOML) or an inline JSON string lists the tenants:

    {"tenants": [
      {"tenant_id": "acme", "api_key": "sk-acme-...",          # or "api_key_sha256": "<hex>"
       "namespace_salt": "...",                                # default: HMAC(salt secret, tenant id)
       "max_concurrent_streams": 64, "requests_per_s": 50.0, "burst_requests": 100}
    ]}

    [[tenants]]                                                # the same in TOML
    tenant_id = "acme"
    api_key = "sk-acme-..."

Namespace salts decide which cache entries a tenant shares (only its own), so they must be neither
guessable nor shared: unless a tenant names its own, its salt is HMAC-SHA256(salt secret, tenant id)
(the gateway's --salt-secret-file; every gateway replica must use the same one, or cache entries
stop being found across replicas). A table where two tenants end up with one salt is refused.

Keys are kept only as SHA-256 digests. `authenticate` hashes the presented key once and compares it
with every tenant's digest using `hmac.compare_digest`, without stopping at the first match, so the
time taken does not depend on which tenant (if any) matched or on how many bytes agree. Keys never
appear in logs, reprs or error messages.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from salon.gateway.types import TenantId

BEARER_PREFIX = "bearer "
_TENANT_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


@dataclass(frozen=True)
class Tenant:
    tenant_id: TenantId
    # Sent to the engine as GenerateRequest.namespace_salt: cache entries are shared only within it.
    namespace_salt: str
    # Streams open at once; more -> RESOURCE_EXHAUSTED. None = unlimited.
    max_concurrent_streams: int | None = None
    # Token-bucket refill rate and size for new requests. None = unlimited.
    requests_per_s: float | None = None
    burst_requests: int | None = None
    key_sha256: bytes = field(default=b"", repr=False)


class TenantConfigError(ValueError):
    pass


def key_digest(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode("utf-8")).digest()


def derive_salt(salt_secret: bytes, tenant_id: str) -> str:
    """The namespace salt of a tenant that names none: HMAC-SHA256(secret, tenant id), hex."""
    return hmac.new(salt_secret, b"salon tenant salt v1\x00" + tenant_id.encode("utf-8"), hashlib.sha256).hexdigest()


def _salt(raw: Mapping[str, Any], tenant_id: str, where: str, salt_secret: bytes | None) -> str:
    salt = raw.get("namespace_salt")
    if salt is not None:
        if not isinstance(salt, str) or not salt:
            raise TenantConfigError(f"{where}.namespace_salt: must be a non-empty string")
        return salt
    if salt_secret is None:
        raise TenantConfigError(
            f"{where}.namespace_salt: not set, and no salt secret (--salt-secret-file) to derive it from"
        )
    return derive_salt(salt_secret, tenant_id)


def _tenant_from_mapping(raw: Mapping[str, Any], index: int, salt_secret: bytes | None = None) -> Tenant:
    where = f"tenants[{index}]"
    tenant_id = raw.get("tenant_id")
    if not isinstance(tenant_id, str) or not _TENANT_ID.fullmatch(tenant_id):
        raise TenantConfigError(f"{where}.tenant_id: required, 1..64 of letters, digits, '_', '.', '-'")
    if ("api_key" in raw) == ("api_key_sha256" in raw):
        raise TenantConfigError(f"{where}: exactly one of api_key and api_key_sha256 is required")
    if "api_key" in raw:
        api_key = raw["api_key"]
        if not isinstance(api_key, str) or len(api_key) < 8:
            raise TenantConfigError(f"{where}.api_key: must be a string of at least 8 characters")
        digest = key_digest(api_key)
    else:
        try:
            digest = bytes.fromhex(str(raw["api_key_sha256"]))
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise TenantConfigError(f"{where}.api_key_sha256: must be 64 hex digits")
    max_streams = raw.get("max_concurrent_streams")
    rate = raw.get("requests_per_s")
    burst = raw.get("burst_requests")
    if max_streams is not None and (not isinstance(max_streams, int) or max_streams < 1):
        raise TenantConfigError(f"{where}.max_concurrent_streams: must be a positive integer")
    if rate is not None and (not isinstance(rate, (int, float)) or not rate > 0):
        raise TenantConfigError(f"{where}.requests_per_s: must be a positive number")
    if burst is not None and (not isinstance(burst, int) or burst < 1):
        raise TenantConfigError(f"{where}.burst_requests: must be a positive integer")
    return Tenant(
        tenant_id=TenantId(tenant_id),
        namespace_salt=_salt(raw, tenant_id, where, salt_secret),
        max_concurrent_streams=max_streams,
        requests_per_s=float(rate) if rate is not None else None,
        burst_requests=burst,
        key_sha256=digest,
    )


class TenantTable:
    def __init__(self, tenants: Iterable[Tenant], anonymous: Tenant | None = None):
        self.tenants: tuple[Tenant, ...] = tuple(tenants)
        ids = [t.tenant_id for t in self.tenants]
        if len(set(ids)) != len(ids):
            raise TenantConfigError("tenant_id values must be unique")
        digests = [t.key_sha256 for t in self.tenants]
        if len(set(digests)) != len(digests):
            raise TenantConfigError("two tenants share an API key")
        by_salt: dict[str, str] = {}
        for tenant in (*self.tenants, *((anonymous,) if anonymous is not None else ())):
            other = by_salt.setdefault(tenant.namespace_salt, tenant.tenant_id)
            if other != tenant.tenant_id:
                raise TenantConfigError(
                    f"tenants {other} and {tenant.tenant_id} have the same namespace_salt: "
                    "tenants never share cache entries"
                )
        # Used for calls without an authorization entry, when configured (development only).
        self.anonymous = anonymous

    def __repr__(self) -> str:
        return f"TenantTable(tenant_ids={[t.tenant_id for t in self.tenants]})"

    @classmethod
    def from_obj(cls, obj: Any, anonymous: Tenant | None = None, salt_secret: bytes | None = None) -> TenantTable:
        if not isinstance(obj, Mapping) or not isinstance(obj.get("tenants"), list):
            raise TenantConfigError("tenant config: expected an object with a 'tenants' list")
        return cls((_tenant_from_mapping(raw, i, salt_secret) for i, raw in enumerate(obj["tenants"])), anonymous)

    @classmethod
    def from_file(
        cls, path: str | Path, anonymous: Tenant | None = None, salt_secret: bytes | None = None
    ) -> TenantTable:
        path = Path(path)
        data = path.read_bytes()
        try:
            obj = tomllib.loads(data.decode("utf-8")) if path.suffix == ".toml" else json.loads(data)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TenantConfigError(f"tenant file {path.name}: cannot parse: {exc}") from None
        return cls.from_obj(obj, anonymous, salt_secret)

    def authenticate(self, authorization: str | None) -> Tenant | None:
        """The tenant whose key is in `authorization` ("Bearer <key>"), or None.

        No authorization at all yields the anonymous tenant when one is configured.
        """
        if authorization is None:
            return self.anonymous
        if authorization[: len(BEARER_PREFIX)].lower() != BEARER_PREFIX:
            return None
        presented = key_digest(authorization[len(BEARER_PREFIX) :].strip())
        found: Tenant | None = None
        for tenant in self.tenants:  # no early exit: every digest is compared
            if hmac.compare_digest(presented, tenant.key_sha256):
                found = tenant
        return found
