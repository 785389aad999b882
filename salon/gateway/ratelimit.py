"""Per-tenant admission: a token bucket for the request rate and a counter of open streams.

Clocks are passed in (seconds, monotonic) so the arithmetic is testable without sleeping.
Queries and commands are separate where it matters: `TokenBucket.try_take` either takes a token or
says how long until one is available; it never takes a token it then refuses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from salon.gateway.tenants import Tenant
from salon.gateway.types import TenantId


class TokenBucket:
    """`rate_per_s` tokens per second, at most `capacity` saved up; starts full."""

    def __init__(self, rate_per_s: float, capacity: int, now_s: float):
        if rate_per_s <= 0 or capacity < 1:
            raise ValueError("rate_per_s must be > 0 and capacity >= 1")
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self._tokens = float(capacity)
        self._updated_s = now_s

    def _refill(self, now_s: float) -> None:
        if now_s > self._updated_s:
            self._tokens = min(float(self.capacity), self._tokens + (now_s - self._updated_s) * self.rate_per_s)
            self._updated_s = now_s

    def available(self, now_s: float) -> float:
        self._refill(now_s)
        return self._tokens

    def try_take(self, now_s: float) -> float | None:
        """Take one token: None on success, else the seconds until one will be available."""
        self._refill(now_s)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (1.0 - self._tokens) / self.rate_per_s


@dataclass
class Refusal:
    """Why a request was not admitted, with a hint for when to retry."""

    reason: str  # "rate" or "concurrency"
    message: str
    retry_after_ms: int


@dataclass
class _TenantState:
    bucket: TokenBucket | None
    num_open_streams: int = 0


@dataclass
class AdmissionControl:
    # Retry hint for the concurrency limit: streams last seconds, so suggest a short wait.
    concurrency_retry_after_ms: int = 250
    _states: dict[TenantId, _TenantState] = field(default_factory=dict)

    def _state(self, tenant: Tenant, now_s: float) -> _TenantState:
        state = self._states.get(tenant.tenant_id)
        if state is None:
            bucket = None
            if tenant.requests_per_s is not None:
                burst = tenant.burst_requests or max(1, math.ceil(tenant.requests_per_s))
                bucket = TokenBucket(tenant.requests_per_s, burst, now_s)
            state = self._states[tenant.tenant_id] = _TenantState(bucket)
        return state

    def num_open_streams(self, tenant_id: TenantId) -> int:
        state = self._states.get(tenant_id)
        return state.num_open_streams if state else 0

    def admit(self, tenant: Tenant, now_s: float, num_streams: int = 1) -> Refusal | None:
        """Open `num_streams` streams for one request of `tenant` (call `release` with the same number
        when they end) or say why not. A request of n choices runs n engine streams: it counts n
        against the concurrency limit and takes one rate token.

        The concurrency limit is checked first so a refused stream does not spend a rate token.
        """
        state = self._state(tenant, now_s)
        limit = tenant.max_concurrent_streams
        if limit is not None and state.num_open_streams + num_streams > limit:
            if num_streams == 1:
                message = f"tenant {tenant.tenant_id}: {limit} concurrent streams already open"
            else:
                free = max(0, limit - state.num_open_streams)
                message = (
                    f"tenant {tenant.tenant_id}: {num_streams} streams asked for, {free} of the limit of "
                    f"{limit} concurrent streams free"
                )
            return Refusal("concurrency", message, self.concurrency_retry_after_ms)
        if state.bucket is not None:
            wait_s = state.bucket.try_take(now_s)
            if wait_s is not None:
                return Refusal(
                    "rate",
                    f"tenant {tenant.tenant_id}: request rate above {tenant.requests_per_s:g}/s",
                    max(1, math.ceil(wait_s * 1000)),
                )
        state.num_open_streams += num_streams
        return None

    def release(self, tenant: Tenant, num_streams: int = 1) -> None:
        state = self._states[tenant.tenant_id]
        assert state.num_open_streams >= num_streams, "release without admit"
        state.num_open_streams -= num_streams
