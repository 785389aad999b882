"""The one gRPC server bootstrap every salon service runs on.

serve(service, config)
  ├─ security config checked (internal_auth.py): a half TLS config or a plaintext internal
  │  listener off loopback refuses to start
  ├─ structlog + OpenTelemetry + Prometheus /metrics (own port)
  ├─ grpc.aio server: OpenTelemetry interceptor -> ServiceInterceptor (caller's role, errors,
  │  request ids, RPC metrics)
  ├─ bind its port (TLS / mutual TLS when configured) and the --health-port, unshared (listen.py):
  │  a taken port (or metrics port) is one line on stderr and exit 2, before any model loads
  ├─ service.start(server, health)      register servicers; long work (model loading) goes in a task
  ├─ grpc.health.v1 (NOT_SERVING until the service calls health.set_serving()) + reflection v1, v1alpha;
  │  optionally also alone on a plaintext --health-port (probes that cannot present a certificate)
  ├─ listen, print `LISTENING <service> port=<p> metrics_port=<m> health_port=<h>`
  ├─ SIGTERM/SIGINT/SIGHUP, or the parent process gone (--parent-pid): health NOT_SERVING ->
  │  server.stop(grace_s) -> service.stop(); exit 0
  └─ health.fatal(reason) (the service cannot go on, e.g. a dead step thread): NOT_SERVING, the same
     stop, exit EXIT_FATAL for the supervisor to restart it
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

from salon.common import internal_auth
from salon.common.interceptors import ServiceInterceptor
from salon.common.listen import NO_PORT_SHARING, PortTakenError, add_grpc_port, bind_problem
from salon.common.logging import configure_logging, get_logger
from salon.common.message_limits import MAX_MESSAGE_BYTES, grpc_options
from salon.common.metrics import start_metrics_server
from salon.common.peer_identity import AccessPolicy
from salon.common.reflection import enable_reflection
from salon.common.startup_heap import freeze_startup_heap, watch_gc_pauses
from salon.common.tracing import configure_tracing, shutdown_tracing

log = get_logger(__name__)

HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

# Exit status of a service that stopped because it could not go on (its supervisor restarts it).
EXIT_FATAL = 70
# How long a failing service reports NOT_SERVING before it stops listening.
FATAL_REPORT_S = 0.5
_PR_SET_PDEATHSIG = 1


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
        metadata={
            "help": "share of new traces recorded, 0..1 (parent-based: callers' decisions are kept); "
            "default: OTEL_TRACES_SAMPLER, else every trace"
        },
    )
    tls_cert_file: str | None = field(default=None, metadata={"help": "PEM certificate chain: serve TLS"})
    tls_key_file: str | None = field(default=None, metadata={"help": "PEM private key for tls_cert_file"})
    tls_client_ca_file: str | None = field(
        default=None, metadata={"help": "PEM CA bundle: require client certificates signed by it (mutual TLS)"}
    )
    internal_auth: str = field(
        default=internal_auth.MTLS,
        metadata={
            "help": "mtls (internal links need certificates with a salon role) | insecure-loopback "
            "(development: plaintext internal links, loopback addresses only)"
        },
    )
    health_port: int | None = field(
        default=None, metadata={"help": "also serve grpc.health.v1 alone, plaintext, on this port (0 = free port)"}
    )
    max_receive_message_bytes: int = field(
        default=MAX_MESSAGE_BYTES, metadata={"help": "largest request message accepted (bigger: RESOURCE_EXHAUSTED)"}
    )
    parent_pid: int | None = field(
        default=None, metadata={"help": "stop when this process (a supervisor such as salon up) is gone"}
    )


class HealthState:
    """The service's grpc.health.v1 status: the overall ("") entry and each registered service."""

    def __init__(self, servicer: HealthServicer, service_names: list[str] | None = None) -> None:
        self._servicer = servicer
        self._names = [""] + list(service_names or [])
        self.serving = False
        # Set by serve(): stops the process with EXIT_FATAL (event loop thread only).
        self._on_fatal = None
        self.fatal_reason: str | None = None

    def add_services(self, names: list[str]) -> None:
        self._names.extend(names)

    async def set_serving(self) -> None:
        if self.fatal_reason is not None:
            return  # a service that gave up never serves again
        freeze_startup_heap()  # the first time: what start-up built lives as long as the process
        self.serving = True
        for name in self._names:
            await self._servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def set_not_serving(self) -> None:
        self.serving = False
        for name in self._names:
            await self._servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    def fatal(self, reason: str) -> None:
        """The service cannot go on: report NOT_SERVING and stop the process with EXIT_FATAL, for its
        supervisor to start a fresh one (event loop thread; other threads use call_soon_threadsafe)."""
        if self.fatal_reason is not None:
            return
        self.fatal_reason = reason
        log.error("fatal", reason=reason)
        self._not_serving = asyncio.ensure_future(self.set_not_serving())  # watchers learn it at once
        if self._on_fatal is not None:
            self._on_fatal()


class Service(Protocol):
    """What a service plugs into `serve`."""

    name: str
    # Internal services name the roles that may call them (peer_identity.py); None: a public service
    # (tenants authenticate per call) whose internal_auth setting governs only its own clients.
    access_policy: AccessPolicy | None

    async def start(self, server: grpc.aio.Server, health: HealthState) -> list[str]:
        """Add servicers to `server`; return their full service names. Must return promptly: slow
        start-up work runs in a task that calls `await health.set_serving()` when ready."""
        ...

    async def stop(self) -> None:
        """Release resources after the server has stopped."""
        ...


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if not config.tls_cert_file and not config.tls_key_file:
        if config.tls_client_ca_file:
            raise internal_auth.SecurityConfigError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
        return None
    if not (config.tls_cert_file and config.tls_key_file):
        raise internal_auth.SecurityConfigError("--tls-cert-file and --tls-key-file go together: give both or neither")
    key = Path(config.tls_key_file).read_bytes()
    cert = Path(config.tls_cert_file).read_bytes()
    client_ca = Path(config.tls_client_ca_file).read_bytes() if config.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _watch_parent(parent_pid: int, stop: asyncio.Event) -> asyncio.Task:
    """Stop when the parent is gone: PR_SET_PDEATHSIG delivers SIGTERM when it dies (Linux), and a
    poll of the parent pid covers the start-up race and other kernels."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass

    async def poll() -> None:
        while os.getppid() == parent_pid:
            await asyncio.sleep(0.5)
        log.warning("parent_gone", parent_pid=parent_pid)
        stop.set()

    return asyncio.create_task(poll(), name="parent-watch")


async def serve(service: Service, config: ServerConfig) -> int:
    """Run `service` until a stop signal (exit status 0) or health.fatal() (EXIT_FATAL)."""
    policy = getattr(service, "access_policy", None)
    internal_auth.check_server(config, internal=policy is not None)
    configure_logging(service.name, config.log_json)
    configure_tracing(
        service.name, config.trace_file, sample_ratio=config.trace_sample_ratio, extract_inbound=policy is not None
    )
    metrics_port = _start_metrics(config) if config.metrics_port is not None else None
    watch_gc_pauses()
    stop = asyncio.Event()
    parent_watch = _watch_parent(config.parent_pid, stop) if config.parent_pid is not None else None

    server = grpc.aio.server(
        # Health checks are not traced: they are frequent, carry no request, and grpc.health.v1's Watch
        # is a coroutine-style stream that the tracing interceptor does not wrap.
        interceptors=[
            aio_server_interceptor(filter_=filters.negate(filters.service_name(HEALTH_SERVICE_NAME))),
            ServiceInterceptor(service.name, policy if config.internal_auth == internal_auth.MTLS else None),
        ],
        options=[*grpc_options(config.max_receive_message_bytes), NO_PORT_SHARING],
    )
    # Ports are bound before the service starts: a taken one costs no model load.
    credentials = server_credentials(config)
    port = add_grpc_port(server, config.host, config.port, "gRPC port", credentials)
    health_server, health_port = None, None
    if config.health_port is not None:
        health_server = grpc.aio.server(options=[NO_PORT_SHARING])
        health_port = add_grpc_port(health_server, config.host, config.health_port, "health port")
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if health_server is not None:
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
    health = HealthState(health_servicer)
    health._on_fatal = stop.set
    await health.set_not_serving()
    names = await service.start(server, health)
    health.add_services(names)
    if not health.serving:
        await health.set_not_serving()
    else:
        await health.set_serving()
    enable_reflection([*names, HEALTH_SERVICE_NAME], server)
    await server.start()
    if health_server is not None:
        await health_server.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    # A service with more listeners (the gateway's HTTP API) names them after the standard three.
    extra = "".join(f" {name}={value}" for name, value in getattr(service, "listening_ports", {}).items())
    print(
        f"LISTENING {service.name} port={port} metrics_port={metrics_port} health_port={health_port}{extra}", flush=True
    )
    log.info(
        "listening",
        port=port,
        metrics_port=metrics_port,
        health_port=health_port,
        tls=credentials is not None,
        internal_auth=config.internal_auth if policy is not None else None,
    )
    if policy is not None and config.internal_auth == internal_auth.INSECURE_LOOPBACK:
        log.warning("insecure_loopback_mode", detail="internal calls are not authenticated (development only)")

    await stop.wait()

    exit_code = EXIT_FATAL if health.fatal_reason is not None else 0
    log.info("shutting_down", grace_s=config.grace_s, fatal=health.fatal_reason)
    await health.set_not_serving()
    stop_accepting = getattr(service, "stop_accepting", None)
    if stop_accepting is not None:
        await stop_accepting()
    if exit_code:
        await asyncio.sleep(FATAL_REPORT_S)  # let health watchers (gateways, probes) see NOT_SERVING
    if parent_watch is not None:
        parent_watch.cancel()
    await server.stop(config.grace_s if exit_code == 0 else min(config.grace_s, 1.0))
    if health_server is not None:
        await health_server.stop(0)
    await service.stop()
    shutdown_tracing()
    log.info("stopped", exit_code=exit_code)
    return exit_code


def _start_metrics(config: ServerConfig) -> int:
    try:
        return start_metrics_server(config.metrics_port, config.host)
    except OSError as exc:
        reason = bind_problem(config.host, config.metrics_port) if config.metrics_port else str(exc)
        raise PortTakenError("metrics port", config.host, config.metrics_port, reason) from exc


def run(service: Service, config: ServerConfig) -> None:
    """Entry point for `python -m salon.<svc>`: exits with serve()'s status (2: refused config, or a port it
    cannot listen on)."""
    try:
        code = asyncio.run(serve(service, config))
    except (internal_auth.SecurityConfigError, PortTakenError) as exc:
        print(f"{service.name}: {exc}", file=sys.stderr, flush=True)
        code = 2
    except KeyboardInterrupt:
        code = 0
    sys.stdout.flush()
    sys.exit(code)
