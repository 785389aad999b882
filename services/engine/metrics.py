"""Prometheus metrics of the engine (names prefixed salon_engine_; latencies in milliseconds)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_MS_BUCKETS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)

TTFT_MS = Histogram("salon_engine_ttft_ms", "Time from arrival to the first generated token (ms).",
                    buckets=_MS_BUCKETS)
ITL_MS = Histogram("salon_engine_itl_ms", "Time between consecutive generated tokens of a request (ms).",
                   buckets=_MS_BUCKETS)
QUEUE_MS = Histogram("salon_engine_queue_ms", "Time from arrival to first scheduling (ms).", buckets=_MS_BUCKETS)
STEP_MS = Histogram("salon_engine_step_ms", "Wall time of one engine step (ms).", buckets=_MS_BUCKETS)
BATCH_SIZE = Histogram("salon_engine_batch_size_sequences", "Sequences in one step.",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128))
BATCH_TOKENS = Histogram("salon_engine_batch_tokens", "Tokens computed in one step.",
                         buckets=(1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048))
RUNNING = Gauge("salon_engine_running_requests", "Requests in the running batch.")
WAITING = Gauge("salon_engine_waiting_requests", "Requests waiting for admission.")
KV_BLOCKS_USED = Gauge("salon_engine_kv_blocks_used", "KV cache blocks held by requests.")
KV_BLOCKS_CACHED = Gauge("salon_engine_kv_blocks_cached", "KV cache blocks held by the prefix cache (reclaimable).")
KV_BLOCKS_FREE = Gauge("salon_engine_kv_blocks_free", "Free KV cache blocks.")
PREEMPTIONS = Counter("salon_engine_preemptions_total", "Requests preempted (recompute) to free KV blocks.")
GENERATED_TOKENS = Counter("salon_engine_generated_tokens_total", "Tokens sampled.")
PROMPT_TOKENS = Counter("salon_engine_prompt_tokens_total", "Prompt tokens of admitted requests.")
REQUESTS_FINISHED = Counter("salon_engine_requests_finished_total", "Finished requests by reason.", ["reason"])
REJECTED = Counter("salon_engine_requests_rejected_total", "Requests refused at admission (queue full).")
DECODE_TOKENS_PER_S = Gauge("salon_engine_decode_tokens_per_s", "Generated tokens per second (recent window).")
# Prefix caching, counted in tokens (cache rate = hit tokens / query tokens, over both sources).
PREFIX_QUERY_TOKENS = Counter("salon_engine_prefix_cache_query_tokens_total",
                              "Prompt tokens of requests looked up in the prefix caches.")
PREFIX_HIT_TOKENS = Counter("salon_engine_prefix_cache_hit_tokens_total",
                            "Prompt tokens whose KV was reused instead of computed, by source (device, host).",
                            ["source"])
HOST_CACHE_CALLS = Counter("salon_engine_kvstore_calls_total",
                           "Calls to the kvstore by operation and outcome (ok, miss, error, skipped).",
                           ["operation", "outcome"])
HOST_CACHE_MS = Histogram("salon_engine_kvstore_lookup_ms", "Time of a kvstore match + fetch (ms).",
                          buckets=_MS_BUCKETS)
