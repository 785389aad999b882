"""Namespace grants the gateway issues for its tenants (salon/common/namespace_grant.py).

An engine passes a request's grant to the kvstore when it stores that request's KV, so only a
namespace the gateway vouched for can be written. Both public fronts (gRPC and HTTP) take grants
from one Grants object; a grant is cached per tenant and reissued at half its life.
"""

from __future__ import annotations

import time

from salon.common import namespace_grant
from salon.gateway.tenants import Tenant

# A cached grant is reissued when it has less than this left (grants last GRANT_TTL_S).
GRANT_REFRESH_S = namespace_grant.GRANT_TTL_S / 2


class Grants:
    def __init__(self, key: bytes | None) -> None:
        self.key = key
        self._cache: dict[str, tuple[bytes, float]] = {}  # tenant id -> (grant, when to reissue, wall clock)

    def for_tenant(self, tenant: Tenant) -> bytes:
        """The tenant's grant for its salt; empty without a grant key (the stack does not check grants)."""
        if self.key is None:
            return b""
        now = time.time()
        cached = self._cache.get(tenant.tenant_id)
        if cached is not None and now < cached[1]:
            return cached[0]
        grant = namespace_grant.issue(self.key, tenant.namespace_salt, now)
        self._cache[tenant.tenant_id] = (grant, now + GRANT_REFRESH_S)
        return grant
