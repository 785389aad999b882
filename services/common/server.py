"""The one gRPC server bootstrap every salon service runs on.

    serve(service, config)
      ├─ structlog + OpenTelemetry + Prometheus /metrics (own port)
      ├─ grpc.aio server: OpenTelemetry interceptor -> ServiceInterceptor (errors, request ids, RPC metrics)
      ├─ service.start(server, health)      register servicers; long work (model loading) goes in a task
      ├─ grpc.health.v1 (NOT_SERVING until the service calls health.set_serving()) + server reflection
      ├─ listen (TLS / mutual TLS when configured), print `LISTENING <service> port=<p> metrics_port=<m>`
      └─ SIGTERM/SIGINT: health NOT_SERVING -> server.stop(grace_s) -> service.stop()
"""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

from services.common.interceptors import ServiceInterceptor
from services.common.logging import configure_logging, get_logger
from services.common.metrics import start_metrics_server
from services.common.tracing import configure_tracing, shutdown_tracing

log = get_logger(__name__)

HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

# Largest gRPC message accepted or sent; bigger requests fail with RESOURCE_EXHAUSTED in grpc itself.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    """Settings every service shares: where it listens, how it shuts down, what it logs and traces."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on"})
    port: int = field(default=0, metadata={"help": "gRPC port (0 picks a free one, printed on start)"})
    metrics_port: int | None = field(default=None, metadata={"help": "Prometheus /metrics port (0 = free port)"})
    grace_s: float = field(default=5.0, metadata={"help": "seconds in-flight RPCs get to finish on shutdown"})
    log_json: bool | None = field(default=None, metadata={"help": "JSON log lines (default: unless stderr is a TTY)"})
    trace_file: str | None = field(default=None, metadata={"help": "also write finished spans to this JSON-lines file"})
    trace_sample_ratio: float | None = field(
        default=None,
        metadata={"help": "share of new traces recorded, 0..1 (parent-based: callers' decisions are kept); "
                          "default: OTEL_TRACES_SAMPLER, else every trace"},
    )
    tls_cert_file: str | None = field(default=None, metadata={"help": "PEM certificate chain: serve TLS"})
    tls_key_file: str | None = field(default=None, metadata={"help": "PEM private key for tls_cert_file"})
    tls_client_ca_file: str | None = field(
        default=None, metadata={"help": "PEM CA bundle: require client certificates signed by it (mutual TLS)"}
    )


class HealthState:
    """The service's grpc.health.v1 status: the overall ("") entry and each registered service."""

    def __init__(self, servicer: HealthServicer, service_names: list[str] | None = None) -> None:
        self._servicer = servicer
        self._names = [""] + list(service_names or [])
        self.serving = False

    def add_services(self, names: list[str]) -> None:
        self._names.extend(names)

    async def set_serving(self) -> None:
        self.serving = True
        for name in self._names:
            await self._servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def set_not_serving(self) -> None:
        self.serving = False
        for name in self._names:
            await self._servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)


class Service(Protocol):
    """What a service plugs into `serve`."""

    name: str

    async def start(self, server: grpc.aio.Server, health: HealthState) -> list[str]:
        """Add servicers to `server`; return their full service names. Must return promptly: slow
        start-up work runs in a task that calls `await health.set_serving()` when ready."""
        ...

    async def stop(self) -> None:
        """Release resources after the server has stopped."""
        ...


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if not config.tls_cert_file:
        return None
    if not config.tls_key_file:
        raise ValueError("tls_cert_file is set but tls_key_file is not")
    key = Path(config.tls_key_file).read_bytes()
    cert = Path(config.tls_cert_file).read_bytes()
    client_ca = Path(config.tls_client_ca_file).read_bytes() if config.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def grpc_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]


async def serve(service: Service, config: ServerConfig) -> None:
    """Run `service` until SIGTERM/SIGINT, then shut it down gracefully."""
    configure_logging(service.name, config.log_json)
    configure_tracing(service.name, config.trace_file, sample_ratio=config.trace_sample_ratio)
    metrics_port = start_metrics_server(config.metrics_port, config.host) if config.metrics_port is not None else None

    server = grpc.aio.server(
        # Health checks are not traced: they are frequent, carry no request, and grpc.health.v1's Watch
        # is a coroutine-style stream that the tracing interceptor does not wrap.
        interceptors=[
            aio_server_interceptor(filter_=filters.negate(filters.service_name(HEALTH_SERVICE_NAME))),
            ServiceInterceptor(service.name),
        ],
        options=grpc_options(),
    )
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health = HealthState(health_servicer)
    await health.set_not_serving()
    names = await service.start(server, health)
    health.add_services(names)
    if not health.serving:
        await health.set_not_serving()
    else:
        await health.set_serving()
    reflection.enable_server_reflection(
        [*names, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    address = f"{config.host}:{config.port}"
    credentials = server_credentials(config)
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    await server.start()
    # A service with more listeners (the gateway's HTTP API) names them after the standard two.
    extra = "".join(f" {name}={value}" for name, value in getattr(service, "listening_ports", {}).items())
    print(f"LISTENING {service.name} port={port} metrics_port={metrics_port}{extra}", flush=True)
    log.info("listening", port=port, metrics_port=metrics_port, tls=credentials is not None)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    log.info("shutting_down", grace_s=config.grace_s)
    await health.set_not_serving()
    stop_accepting = getattr(service, "stop_accepting", None)
    if stop_accepting is not None:
        await stop_accepting()
    await server.stop(config.grace_s)
    await service.stop()
    shutdown_tracing()
    log.info("stopped")


def run(service: Service, config: ServerConfig) -> None:
    """Entry point for `python -m services.<svc>`."""
    try:
        asyncio.run(serve(service, config))
    except KeyboardInterrupt:
        pass
    sys.stdout.flush()
