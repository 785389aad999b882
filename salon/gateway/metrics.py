"""Prometheus metrics of the gateway (default registry; served by the bootstrap on metrics_port).
Latencies are `_seconds` histograms; the turn's latencies carry the served model as `model_name`, the
engines' label. The HTTP port's /metrics shows this registry too, less the per-tenant series (http/probes.py).
A series that means "not configured" is absent, not 0 (session_store_up without Redis)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from salon.common.metrics import LATENCY_BUCKETS_S

# salon's latency buckets, with finer ones below for the gateway's own sub-millisecond work.
_LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.002, *LATENCY_BUCKETS_S)

REQUESTS = Counter(
    "salon_gateway_requests_total",
    "Generate calls by serving engine, tenant and final gRPC status code.",
    ["engine", "tenant", "code"],
)
ROUTE_DECISIONS = Counter(
    "salon_gateway_route_decisions_total",
    "Routing outcomes: sticky (session engine kept), move (session engine gone or full), "
    "home (new dialogue on its ring owner), spill (ring owner full, next engine taken).",
    ["outcome"],
)
ROUTED_STICKY = ROUTE_DECISIONS.labels(outcome="sticky")
ROUTED_MOVE = ROUTE_DECISIONS.labels(outcome="move")
ROUTED_HOME = ROUTE_DECISIONS.labels(outcome="home")
ROUTED_SPILL = ROUTE_DECISIONS.labels(outcome="spill")
SPILLS = Counter(
    "salon_gateway_spills_total",
    "Requests placed past their first candidate engine because it was above the load bound.",
)
FAILOVERS = Counter(
    "salon_gateway_failovers_total",
    "Streams moved to another engine after the serving engine failed mid-stream.",
    ["from_engine"],
)
STREAM_STALLS = Counter(
    "salon_gateway_stream_stalls_total",
    "Engine streams given up for silence and failed over, by engine and kind: first_token (no first event "
    "within --first-token-timeout-s), inter_token (no next event within --inter-token-timeout-s), engine_silent "
    "(the engine's load reports went stale while the stream waited for its first event).",
    ["engine", "kind"],
)
ENGINE_STALE = Counter(
    "salon_gateway_engine_stale_total",
    "Times an engine left the ring because its load reports stopped for --engine-stale-after-s.",
    ["engine"],
)
ADDED_LATENCY = Histogram(
    "salon_gateway_added_latency_seconds",
    "Time the gateway spends before the engine call is issued (auth, admission, routing, session lookup), seconds.",
    ["model_name"],
    buckets=_LATENCY_BUCKETS_S,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "salon_gateway_time_to_first_token_seconds",
    "Time from request arrival at the gateway to the first token forwarded, seconds.",
    ["model_name"],
    buckets=_LATENCY_BUCKETS_S,
)
REFUSALS = Counter(
    "salon_gateway_refusals_total",
    "Requests refused at the edge by reason (unauthenticated, rate, concurrency, invalid, no_engine).",
    ["reason"],
)
ENGINE_SERVING = Gauge(
    "salon_gateway_engine_serving",
    "1 while the engine is SERVING, not draining and has reported its model (a member of its model's ring), else 0.",
    ["engine"],
)
ENGINE_INFLIGHT = Gauge(
    "salon_gateway_engine_inflight_streams",
    "Streams this gateway has open to the engine.",
    ["engine"],
)
SESSION_STORE_UP = Gauge(
    "salon_gateway_session_store_up",
    "1 while the shared session store answers, 0 while the gateway falls back to the ring; "
    "absent when none is configured.",
    ["store"],
)
SESSION_STORE_ERRORS = Counter(
    "salon_gateway_session_store_errors_total",
    "Session-store operations that failed or timed out (the request was routed by the ring).",
    ["op"],
)
