"""The gateway's one configuration dataclass, built in __main__ from flags/env (SALON_GATEWAY_*)."""

from __future__ import annotations

from dataclasses import dataclass, field

from salon.common.server import ServerConfig
from salon.gateway.membership import ENGINE_STALE_AFTER_S
from salon.gateway.routing import LOAD_FACTOR, MIN_CAPACITY, OPENING_MAX_BYTES
from salon.gateway.stall_watch import FIRST_TOKEN_TIMEOUT_S, INTER_TOKEN_TIMEOUT_S

# Largest public request message: a long dialogue is well under a MiB; more is refused by grpc itself
# (RESOURCE_EXHAUSTED) before it is parsed.
PUBLIC_MAX_RECEIVE_MESSAGE_BYTES = 4 << 20


@dataclass(frozen=True)
class GatewayConfig:
    """salon gateway: the public salon.chat.v1.ChatService in front of one pool of engines per model."""

    server: ServerConfig = field(
        default_factory=lambda: ServerConfig(max_receive_message_bytes=PUBLIC_MAX_RECEIVE_MESSAGE_BYTES)
    )
    # Membership.
    engines: str = field(default="", metadata={"help": "static engines: id=host:port,id=host:port"})
    engines_dns: str | None = field(
        default=None, metadata={"help": "headless-service name:port resolved periodically to engine addresses"}
    )
    dns_interval_s: float = field(default=5.0, metadata={"help": "seconds between DNS resolutions"})
    health_service: str = field(default="", metadata={"help": "grpc.health.v1 service name watched on engines"})
    load_interval_ms: int = field(default=250, metadata={"help": "WatchLoad report interval"})
    engine_stale_after_s: float = field(
        default=ENGINE_STALE_AFTER_S,
        metadata={
            "help": "an engine whose load reports stop for this long leaves the ring until it reports again "
            "(0: never; at least twice the report interval)"
        },
    )
    # Tenants.
    tenants_file: str | None = field(default=None, metadata={"help": "tenant table, JSON or TOML (see tenants.py)"})
    tenants_json: str | None = field(default=None, metadata={"help": "tenant table as an inline JSON string"})
    salt_secret_file: str | None = field(
        default=None,
        metadata={
            "help": "secret for tenant salts: HMAC(secret, tenant id) unless a tenant sets one "
            "(the same file on every gateway replica)"
        },
    )
    namespace_grant_key_file: str | None = field(
        default=None, metadata={"help": "key shared with the kvstores: sign namespace grants for the engines"}
    )
    allow_anonymous: bool = field(
        default=False, metadata={"help": "serve calls without an API key as tenant 'anonymous' (development only)"}
    )
    concurrency_retry_after_ms: int = field(
        default=250, metadata={"help": "retry hint when a tenant's streams are full"}
    )
    # Routing.
    routing_policy: str = field(default="bounded_load", metadata={"help": "bounded_load | least_loaded"})
    load_factor: float = field(default=LOAD_FACTOR, metadata={"help": "c of bounded loads: cap = c x mean load"})
    min_capacity_streams: int = field(
        default=MIN_CAPACITY, metadata={"help": "below this many streams an engine never counts as full (no spill)"}
    )
    max_failovers: int = field(default=2, metadata={"help": "engine moves per reply after mid-stream failures"})
    first_token_timeout_s: float = field(
        default=FIRST_TOKEN_TIMEOUT_S,
        metadata={
            "help": "longest wait for an engine stream's first event once the engine's queue is empty, "
            "before the reply fails over (0: no bound; a silent engine fails over at once)"
        },
    )
    inter_token_timeout_s: float = field(
        default=INTER_TOKEN_TIMEOUT_S,
        metadata={"help": "longest silence between an engine stream's events before the reply fails over (0: none)"},
    )
    # Session table.
    session_ttl_s: float = field(
        default=3600.0, metadata={"help": "how long a dialogue remembers its engine, and a stored response lives"}
    )
    redis_url: str | None = field(
        default=None, metadata={"help": "redis://host:port/db: share sessions across replicas"}
    )
    redis_max_connections: int = field(default=32, metadata={"help": "Redis pool size (callers wait beyond it)"})
    redis_pool_timeout_s: float = field(default=0.2, metadata={"help": "longest wait for a pooled Redis connection"})
    redis_op_timeout_s: float = field(default=0.2, metadata={"help": "timeout of one Redis operation"})
    redis_retry_interval_s: float = field(
        default=1.0, metadata={"help": "after a Redis failure, ring-only for this long"}
    )
    # Engine channels (mutual TLS between services).
    engine_tls_ca_file: str | None = field(default=None, metadata={"help": "CA of the engines' certificates"})
    engine_tls_cert_file: str | None = field(default=None, metadata={"help": "our client certificate (mutual TLS)"})
    engine_tls_key_file: str | None = field(default=None, metadata={"help": "key of engine_tls_cert_file"})
    engine_tls_server_name: str | None = field(
        default=None,
        metadata={
            "help": "name the engines' certificate must carry (default: the dialed host; set it "
            "when engines are dialed by IP, e.g. engine.salon.svc)"
        },
    )
    default_model: str = field(
        default="",
        metadata={
            "help": "model of requests that name none (default: the model of the first configured engine that reports)"
        },
    )
    model_info_ttl_s: float = field(default=30.0, metadata={"help": "how long GetModelInfo answers are cached"})
    # The OpenAI-compatible HTTP API (salon/gateway/http/).
    http_port: int | None = field(
        default=None, metadata={"help": "OpenAI-compatible HTTP API port (0 = free port; default: off)"}
    )
    http_max_body_bytes: int = field(
        default=4 << 20, metadata={"help": "largest HTTP request body (bigger: 413 before it is parsed)"}
    )
    http_header_timeout_s: float = field(
        default=10.0, metadata={"help": "an HTTP request's head must arrive within this (else the connection closes)"}
    )
    http_body_timeout_s: float = field(
        default=60.0, metadata={"help": "an HTTP request's body must arrive within this"}
    )
    http_idle_timeout_s: float = field(
        default=15.0, metadata={"help": "an idle HTTP keep-alive connection closes after"}
    )
    http_max_connections: int = field(
        default=1024, metadata={"help": "open HTTP connections beyond which requests are answered 503"}
    )
    opening_max_bytes: int = field(
        default=OPENING_MAX_BYTES,
        metadata={"help": "bytes of a stateless dialogue's opening hashed into its routing key (0: no prefix routing)"},
    )
