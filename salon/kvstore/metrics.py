"""Prometheus metrics of the kvstore (names prefixed salon_kvstore_). Gauges read the store live."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

USED_BYTES = Gauge("salon_kvstore_used_bytes", "Bytes of KV held.")
CAPACITY_BYTES = Gauge("salon_kvstore_capacity_bytes", "Capacity in bytes.")
BLOCKS = Gauge("salon_kvstore_blocks", "Stored blocks (global KV).")
LOCAL_BLOCKS = Gauge("salon_kvstore_local_blocks", "Stored blocks that also hold local (sliding-window) KV.")
LEASES = Gauge("salon_kvstore_leases", "Shared-memory leases held.")
QUERY_TOKENS = Counter("salon_kvstore_query_tokens_total", "Tokens asked for in Match calls.")
MATCHED_TOKENS = Counter("salon_kvstore_matched_tokens_total", "Tokens found stored by Match calls.")
HIT_TOKENS = Counter("salon_kvstore_hit_tokens_total", "Tokens found usable by Match calls.")
MISS_TOKENS = Counter("salon_kvstore_miss_tokens_total", "Tokens asked for in Match calls and not usable.")
EVICTED_BLOCKS = Counter("salon_kvstore_evicted_blocks_total", "Blocks evicted (global and local KV).")
EVICTED_LOCAL_BLOCKS = Counter("salon_kvstore_evicted_local_blocks_total", "Local KV payloads evicted on their own.")
FETCH_BYTES = Counter("salon_kvstore_fetch_bytes_total", "KV bytes served by Fetch, by transport.", ["transport"])
PUT_BYTES = Counter("salon_kvstore_put_bytes_total", "KV bytes received by puts, by transport.", ["transport"])
EXPIRED_LEASES = Counter("salon_kvstore_expired_leases_total", "Shared-memory leases that ended by timeout.")
REFUSED_COMMITS = Counter(
    "salon_kvstore_refused_commits_total",
    "Shared-memory puts refused at commit: a slot did not hold what the engine said it wrote, was never written, "
    "or the lease had expired.",
)
QUARANTINED_BYTES = Gauge(
    "salon_kvstore_quarantined_bytes", "Bytes of expired put leases held back from reuse until their writer is done."
)
