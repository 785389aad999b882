"""Prometheus metrics of the engine. Every series vLLM has is exported under vLLM's name, labels and
finished_reason values (`vllm:time_to_first_token_seconds{model_name, engine}`), so vLLM dashboards and
alerts work unchanged; what only salon measures (KV blocks, memory, steps, the kvstore link, prefix
hits by tier) is `salon_engine_*` with the same two labels. Latencies are `_seconds` histograms on
vLLM's buckets with finer ones below (a small model answers in milliseconds).

Call sites use the module attributes (`metrics.TIME_TO_FIRST_TOKEN.observe(s)`): each is bound to the
model and engine named by `set_model` (once, when the model is loaded), so no call site passes them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from salon.common.metrics import LATENCY_BUCKETS_S

# vLLM's buckets (vllm/v1/metrics/loggers.py), with finer ones below its first where salon's small
# models run: a token every few milliseconds, a short request in tens of them.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS_S += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75)
ITL_BUCKETS_S += (1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0)
REQUEST_BUCKETS_S += (30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

# salon's FinishReason values -> vLLM's finished_reason label values.
VLLM_FINISHED_REASONS = {
    "stop_token": "stop",
    "stop_string": "stop",
    "length": "length",
    "context_full": "length",
    "aborted": "abort",
    "error": "error",
}
_LABELS = ["model_name", "engine"]
_bound = ("", "")


def set_model(model_name: str, engine_id: str) -> None:
    """Label every series of this process with `model_name` and `engine_id` from now on."""
    global _bound
    _bound = (model_name, engine_id)


class _ModelBound:
    """A metric family whose first labels are the process's model and engine; `.labels(...)` takes the others."""

    def __init__(self, family):
        self._family = family

    def labels(self, *values):
        return self._family.labels(*_bound, *values)

    def __getattr__(self, name):
        return getattr(self._family.labels(*_bound), name)


def _histogram(name: str, doc: str, buckets=LATENCY_BUCKETS_S, labels: tuple[str, ...] = ()) -> _ModelBound:
    return _ModelBound(Histogram(name, doc, [*_LABELS, *labels], buckets=buckets))


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> _ModelBound:
    return _ModelBound(Counter(name, doc, [*_LABELS, *labels]))


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> _ModelBound:
    return _ModelBound(Gauge(name, doc, [*_LABELS, *labels]))


# Requests. A request's phases, as vLLM splits them:
#   arrival ──queue──> first scheduled ──prefill──> first token ──decode──> last token
#           |                           └──────────── inference ───────────┘
#           └───────────────────────────── e2e ────────────────────────────┘
TIME_TO_FIRST_TOKEN = _histogram(
    "vllm:time_to_first_token_seconds", "Time from a request's arrival to its first generated token.", TTFT_BUCKETS_S
)
INTER_TOKEN_LATENCY = _histogram(
    "vllm:inter_token_latency_seconds",
    "Time between consecutive generated tokens of a request, one observation per token.",
    ITL_BUCKETS_S,
)
REQUEST_TIME_PER_OUTPUT_TOKEN = _histogram(
    "vllm:request_time_per_output_token_seconds",
    "Mean time per generated token after the first, one observation per request of 2+ tokens.",
    ITL_BUCKETS_S,
)
E2E_REQUEST_LATENCY = _histogram(
    "vllm:e2e_request_latency_seconds", "Time from a request's arrival to its last token.", REQUEST_BUCKETS_S
)
REQUEST_QUEUE_TIME = _histogram(
    "vllm:request_queue_time_seconds", "Time from a request's arrival to its first scheduling.", REQUEST_BUCKETS_S
)
REQUEST_PREFILL_TIME = _histogram(
    "vllm:request_prefill_time_seconds", "Time from a request's first scheduling to its first token.", REQUEST_BUCKETS_S
)
REQUEST_DECODE_TIME = _histogram(
    "vllm:request_decode_time_seconds", "Time from a request's first token to its last.", REQUEST_BUCKETS_S
)
REQUEST_INFERENCE_TIME = _histogram(
    "vllm:request_inference_time_seconds",
    "Time from a request's first scheduling to its last token (prefill + decode).",
    REQUEST_BUCKETS_S,
)
REQUEST_PROMPT_TOKENS = _histogram("vllm:request_prompt_tokens", "Prompt tokens of finished requests.", TOKEN_BUCKETS)
REQUEST_GENERATION_TOKENS = _histogram(
    "vllm:request_generation_tokens", "Generated tokens of finished requests.", TOKEN_BUCKETS
)
REQUEST_SUCCESS = _counter(
    "vllm:request_success_total",
    "Finished requests by finished_reason: stop (a stop token or string), length (max_tokens or the context "
    "window), abort (cancelled, deadline), error.",
    ("finished_reason",),
)
REJECTED = _counter("salon_engine_requests_rejected_total", "Requests refused at admission (queue full).")
# Scheduler state.
NUM_REQUESTS_RUNNING = _gauge("vllm:num_requests_running", "Requests in the running batch.")
NUM_REQUESTS_WAITING = _gauge("vllm:num_requests_waiting", "Requests waiting for admission.")
KV_CACHE_USAGE = _gauge(
    "vllm:kv_cache_usage_perc",
    "Share of KV cache blocks held by requests, 0..1 (blocks held only by the prefix cache "
    "are reclaimable and count as free).",
)
KV_BLOCKS_USED = _gauge("salon_engine_kv_blocks_used", "KV cache blocks held by requests.")
KV_BLOCKS_CACHED = _gauge("salon_engine_kv_blocks_cached", "KV cache blocks held by the prefix cache (reclaimable).")
KV_BLOCKS_FREE = _gauge("salon_engine_kv_blocks_free", "Free KV cache blocks.")
NUM_PREEMPTIONS = _counter("vllm:num_preemptions_total", "Requests preempted (recompute) to free KV blocks.")
# Memory (salon/engine/resident.py).
RESIDENT_BYTES = _gauge(
    "salon_engine_resident_bytes",
    "Resident memory of the engine process by part: total (RSS), weights, kv_cache (allocated), "
    "other (total - weights - kv_cache), arena (the kvstore's shared pages mapped in).",
    ("part",),
)
# Tokens.
PROMPT_TOKENS = _counter("vllm:prompt_tokens_total", "Prompt tokens of admitted requests.")
GENERATION_TOKENS = _counter("vllm:generation_tokens_total", "Tokens sampled.")
SPEC_DRAFT_TOKENS = _counter("vllm:spec_decode_num_draft_tokens_total", "Draft tokens verified (speculative decoding).")
SPEC_ACCEPTED_TOKENS = _counter(
    "vllm:spec_decode_num_accepted_tokens_total",
    "Draft tokens accepted (they became output tokens); acceptance rate = accepted / draft.",
)
SPEC_GRAMMAR_TRUNCATED_TOKENS = _counter(
    "salon_engine_spec_decode_grammar_truncated_tokens_total",
    "Draft tokens cut before verification because the request's constraint does not allow them.",
)
DECODE_TOKENS_PER_SECOND = _gauge(
    "salon_engine_decode_tokens_per_second",
    "Generated tokens per second over the last few seconds (what the engine's load reports carry).",
)
# Steps.
STEP_DURATION = _histogram(
    "salon_engine_step_duration_seconds", "Wall time of one engine step.", (0.001, 0.0025, *LATENCY_BUCKETS_S)
)
BATCH_SIZE = _histogram("salon_engine_batch_size_sequences", "Sequences in one step.", (1, 2, 4, 8, 16, 32, 64, 128))
BATCH_TOKENS = _histogram(
    "salon_engine_batch_tokens", "Tokens computed in one step.", (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)
)
# Prefix caching, in tokens; cache rate = hits / queries. One lookup covers both tiers (the device's
# cache and the kvstore's), so vLLM's hits count either and salon's own series splits them by tier.
PREFIX_CACHE_QUERIES = _counter("vllm:prefix_cache_queries_total", "Prompt tokens of requests looked up.")
PREFIX_CACHE_HITS = _counter(
    "vllm:prefix_cache_hits_total", "Prompt tokens whose KV was reused instead of computed (device or kvstore)."
)
PREFIX_CACHE_HITS_BY_SOURCE = _counter(
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
    "Time of a kvstore match + fetch.",
    (0.0005, 0.001, 0.0025, *LATENCY_BUCKETS_S),
)
