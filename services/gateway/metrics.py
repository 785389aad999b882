"""Prometheus metrics of the gateway (default registry; served by the bootstrap on metrics_port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000, 5000)

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
ADDED_LATENCY_MS = Histogram(
    "salon_gateway_added_latency_ms",
    "Time the gateway spends before the engine call is issued (auth, admission, routing, session "
    "lookup), milliseconds.",
    buckets=_LATENCY_BUCKETS_MS,
)
TTFT_MS = Histogram(
    "salon_gateway_ttft_ms",
    "Time from request arrival at the gateway to the first token forwarded, milliseconds.",
    buckets=_LATENCY_BUCKETS_MS,
)
REFUSALS = Counter(
    "salon_gateway_refusals_total",
    "Requests refused at the edge by reason (unauthenticated, rate, concurrency, invalid, no_engine).",
    ["reason"],
)
ENGINE_SERVING = Gauge(
    "salon_gateway_engine_serving",
    "1 while the engine is SERVING and not draining (a member of the ring), else 0.",
    ["engine"],
)
ENGINE_INFLIGHT = Gauge(
    "salon_gateway_engine_inflight_streams",
    "Streams this gateway has open to the engine.",
    ["engine"],
)
SESSION_STORE_UP = Gauge(
    "salon_gateway_session_store_up",
    "1 while the shared session store (Redis) answers, 0 while the gateway falls back to the ring.",
)
SESSION_STORE_ERRORS = Counter(
    "salon_gateway_session_store_errors_total",
    "Session-store operations that failed or timed out (the request was routed by the ring).",
    ["op"],
)
