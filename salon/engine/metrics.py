"""Prometheus metrics of the engine: names aligned with vLLM's under `salon_engine_`, latencies as
`_seconds` histograms (5 ms to 120 s), every series labelled with the served `model`.

Call sites use the module attributes (`metrics.TIME_TO_FIRST_TOKEN.observe(s)`): each is bound to the
model named by `set_model` (once, when the model is loaded), so no call site passes the label.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    120.0,
)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
_model_id = ""


def set_model(model_id: str) -> None:
    """Label every series of this process with `model_id` from now on."""
    global _model_id
    _model_id = model_id


class _ModelBound:
    """A metric family whose first label is the process's model; `.labels(...)` takes the others."""

    def __init__(self, family):
        self._family = family

    def labels(self, *values):
        return self._family.labels(_model_id, *values)

    def __getattr__(self, name):
        return getattr(self._family.labels(_model_id), name)


def _histogram(name: str, doc: str, buckets=LATENCY_BUCKETS_S, labels: tuple[str, ...] = ()) -> _ModelBound:
    return _ModelBound(Histogram(name, doc, ["model", *labels], buckets=buckets))


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> _ModelBound:
    return _ModelBound(Counter(name, doc, ["model", *labels]))


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> _ModelBound:
    return _ModelBound(Gauge(name, doc, ["model", *labels]))


# Requests (vLLM: time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds,
# request_queue_time_seconds, request_prompt_tokens, request_generation_tokens, request_success_total).
TIME_TO_FIRST_TOKEN = _histogram(
    "salon_engine_time_to_first_token_seconds", "Time from a request's arrival to its first generated token (seconds)."
)
INTER_TOKEN_LATENCY = _histogram(
    "salon_engine_inter_token_latency_seconds",
    "Time between consecutive generated tokens of a request, per token (seconds).",
)
E2E_REQUEST_LATENCY = _histogram(
    "salon_engine_e2e_request_latency_seconds", "Time from a request's arrival to its last token (seconds)."
)
REQUEST_QUEUE_TIME = _histogram(
    "salon_engine_request_queue_time_seconds", "Time from a request's arrival to its first scheduling (seconds)."
)
REQUEST_PROMPT_TOKENS = _histogram(
    "salon_engine_request_prompt_tokens", "Prompt tokens of finished requests.", TOKEN_BUCKETS
)
REQUEST_GENERATION_TOKENS = _histogram(
    "salon_engine_request_generation_tokens", "Generated tokens of finished requests.", TOKEN_BUCKETS
)
REQUEST_SUCCESS = _counter(
    "salon_engine_request_success_total", "Finished requests by finished_reason.", ("finished_reason",)
)
REJECTED = _counter("salon_engine_requests_rejected_total", "Requests refused at admission (queue full).")
# Scheduler state (vLLM: num_requests_running, num_requests_waiting, kv_cache_usage_perc, num_preemptions_total).
NUM_REQUESTS_RUNNING = _gauge("salon_engine_num_requests_running", "Requests in the running batch.")
NUM_REQUESTS_WAITING = _gauge("salon_engine_num_requests_waiting", "Requests waiting for admission.")
KV_CACHE_USAGE_RATIO = _gauge(
    "salon_engine_kv_cache_usage_ratio",
    "Share of KV cache blocks held by requests, 0..1 (blocks held only by the prefix cache "
    "are reclaimable and count as free).",
)
KV_BLOCKS_USED = _gauge("salon_engine_kv_blocks_used", "KV cache blocks held by requests.")
KV_BLOCKS_CACHED = _gauge("salon_engine_kv_blocks_cached", "KV cache blocks held by the prefix cache (reclaimable).")
KV_BLOCKS_FREE = _gauge("salon_engine_kv_blocks_free", "Free KV cache blocks.")
NUM_PREEMPTIONS = _counter("salon_engine_num_preemptions_total", "Requests preempted (recompute) to free KV blocks.")
# Memory (salon/engine/resident.py).
RESIDENT_BYTES = _gauge(
    "salon_engine_resident_bytes",
    "Resident memory of the engine process by part: total (RSS), weights, kv_cache (allocated), "
    "other (total - weights - kv_cache), arena (the kvstore's shared pages mapped in).",
    ("part",),
)
# Tokens (vLLM: prompt_tokens_total, generation_tokens_total).
PROMPT_TOKENS = _counter("salon_engine_prompt_tokens_total", "Prompt tokens of admitted requests.")
GENERATION_TOKENS = _counter("salon_engine_generation_tokens_total", "Tokens sampled.")
# Speculative decoding (vLLM: spec_decode_num_draft_tokens, spec_decode_num_accepted_tokens).
SPEC_DRAFT_TOKENS = _counter(
    "salon_engine_spec_decode_num_draft_tokens_total", "Draft tokens verified (speculative decoding)."
)
SPEC_ACCEPTED_TOKENS = _counter(
    "salon_engine_spec_decode_num_accepted_tokens_total",
    "Draft tokens accepted (they became output tokens); acceptance rate = accepted / draft.",
)
DECODE_TOKENS_PER_S = _gauge("salon_engine_decode_tokens_per_s", "Generated tokens per second (recent window).")
# Steps.
STEP_DURATION = _histogram(
    "salon_engine_step_duration_seconds", "Wall time of one engine step (seconds).", (0.001, 0.0025, *LATENCY_BUCKETS_S)
)
BATCH_SIZE = _histogram("salon_engine_batch_size_sequences", "Sequences in one step.", (1, 2, 4, 8, 16, 32, 64, 128))
BATCH_TOKENS = _histogram(
    "salon_engine_batch_tokens", "Tokens computed in one step.", (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)
)
# Prefix caching, in tokens (vLLM: prefix_cache_queries, prefix_cache_hits); cache rate = hits / queries.
PREFIX_CACHE_QUERIES = _counter(
    "salon_engine_prefix_cache_queries_total", "Prompt tokens of requests looked up in the prefix caches."
)
PREFIX_CACHE_HITS = _counter(
    "salon_engine_prefix_cache_hits_total",
    "Prompt tokens whose KV was reused instead of computed, by source (device, host).",
    ("source",),
)
# The kvstore link.
HOST_CACHE_CALLS = _counter(
    "salon_engine_kvstore_calls_total",
    "Calls to the kvstore by operation and outcome (ok, miss, error, skipped).",
    ("operation", "outcome"),
)
HOST_CACHE_LOOKUP = _histogram(
    "salon_engine_kvstore_lookup_seconds",
    "Time of a kvstore match + fetch (seconds).",
    (0.0005, 0.001, 0.0025, *LATENCY_BUCKETS_S),
)
