"""Prefix caching: KV already computed for a context's first tokens, reused instead of recomputed.

Two tiers: the device cache keeps finished requests' block tables in the paged cache; the host cache
is the kvstore, reached over gRPC and shared memory, shared by every engine of a model.

    policy.py        when to look up, adopt, retire and put (PrefixCaching, the scheduler's one entry point)
    device_cache.py  the device tier: cached block tables by block hash, reclaimable on demand
    host_cache.py    the host tier: lookups, fetches and puts against the kvstore
    hit.py           a lookup's answer (PrefixHit) and the rules both tiers share
    fork.py          a running request's prompt KV copied for a request that repeats the prompt (n > 1)
"""
