"""Prometheus metrics shared by every service, and the /metrics endpoint.

Each service defines its own metrics in salon/<svc>/metrics.py (names prefixed `salon_<svc>_`);
the RPC-level counters below are recorded by the server interceptor for every service.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram, disable_created_metrics, start_http_server

# salon's own latencies (engine steps, kvstore calls, a gateway's streams): 5 ms .. 120 s; a service adds finer
# buckets below for its own faster work.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
LATENCY_BUCKETS_S += (80.0, 120.0)

# No `_created` series: they double every counter and histogram and no dashboard reads them.
disable_created_metrics()

RPC_REQUESTS = Counter(
    "salon_rpc_requests_total",
    "gRPC requests handled, by service, method and status code.",
    ["service", "method", "code"],
)
RPC_DURATION_SECONDS = Histogram(
    "salon_rpc_duration_seconds",
    "Wall time of gRPC requests (whole stream for streaming RPCs), by service and method.",
    ["service", "method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)


def start_metrics_server(port: int, host: str = "127.0.0.1") -> int:
    """Serve /metrics on host:port (0 picks a free port); return the bound port."""
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)
