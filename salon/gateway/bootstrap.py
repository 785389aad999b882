"""The gateway as a `Service` for salon.common.server.serve: builds its parts from the config."""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.common import internal_auth, namespace_grant
from salon.common.logging import get_logger
from salon.common.server import HealthState
from salon.gateway.config import GatewayConfig
from salon.gateway.dispatch import Dispatcher, DispatchSettings
from salon.gateway.grants import Grants
from salon.gateway.membership import EnginePool, PoolSettings, parse_engine_list
from salon.gateway.model_pools import ModelPools
from salon.gateway.ratelimit import AdmissionControl
from salon.gateway.routing import make_policy
from salon.gateway.servicer import ChatServicer
from salon.gateway.sessions import InMemorySessionTable, SessionTable
from salon.gateway.sessions_redis import RedisSessionTable
from salon.gateway.stall_watch import StallTimeouts
from salon.gateway.tenants import Tenant, TenantConfigError, TenantTable, derive_salt
from salon.gateway.types import TenantId

log = get_logger(__name__)


def build_tenants(config: GatewayConfig) -> TenantTable:
    secret = namespace_grant.load_key(config.salt_secret_file) if config.salt_secret_file else None
    anonymous = None
    if config.allow_anonymous:
        salt = derive_salt(secret, "anonymous") if secret is not None else "tenant:anonymous"
        anonymous = Tenant(TenantId("anonymous"), salt)
    if config.tenants_file and config.tenants_json:
        raise TenantConfigError("give tenants_file or tenants_json, not both")
    if config.tenants_file:
        return TenantTable.from_file(config.tenants_file, anonymous, secret)
    if config.tenants_json:
        import json

        try:
            obj = json.loads(config.tenants_json)
        except json.JSONDecodeError as exc:
            raise TenantConfigError(f"tenants_json: cannot parse: {exc.msg}") from None
        return TenantTable.from_obj(obj, anonymous, secret)
    return TenantTable((), anonymous)


def build_sessions(config: GatewayConfig) -> SessionTable:
    if config.redis_url:
        return RedisSessionTable(
            config.redis_url,
            ttl_s=config.session_ttl_s,
            max_connections=config.redis_max_connections,
            pool_timeout_s=config.redis_pool_timeout_s,
            op_timeout_s=config.redis_op_timeout_s,
            retry_interval_s=config.redis_retry_interval_s,
        )
    return InMemorySessionTable(ttl_s=config.session_ttl_s)


def pool_settings(config: GatewayConfig) -> PoolSettings:
    dns_name, dns_port = None, 50051
    if config.engines_dns:
        host, sep, port = config.engines_dns.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"engines_dns: expected name:port, got {config.engines_dns!r}")
        dns_name, dns_port = host, int(port)
    tls = internal_auth.client_tls_or_none(
        "--engine-tls",
        config.engine_tls_ca_file,
        config.engine_tls_cert_file,
        config.engine_tls_key_file,
        config.engine_tls_server_name,
    )
    if config.engine_stale_after_s < 0 or 0 < config.engine_stale_after_s < 2 * config.load_interval_ms / 1000:
        raise ValueError(
            f"engine_stale_after_s: {config.engine_stale_after_s:g} s; give 0 (off) or at least twice "
            f"load_interval_ms ({2 * config.load_interval_ms / 1000:g} s), or live engines would leave the ring"
        )
    return PoolSettings(
        health_service=config.health_service,
        load_interval_ms=config.load_interval_ms,
        stale_after_s=config.engine_stale_after_s,
        dns_name=dns_name,
        dns_port=dns_port,
        dns_interval_s=config.dns_interval_s,
        tls=tls,
    )


def dispatch_settings(config: GatewayConfig) -> DispatchSettings:
    for name in ("first_token_timeout_s", "inter_token_timeout_s"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name}: {getattr(config, name):g} s; give 0 (no bound) or more")
    return DispatchSettings(
        max_failovers=config.max_failovers,
        stall=StallTimeouts(config.first_token_timeout_s, config.inter_token_timeout_s),
    )


def build_http_server(
    config: GatewayConfig,
    tenants: TenantTable,
    admission: AdmissionControl,
    dispatcher: Dispatcher,
    pools: ModelPools,
    grants: Grants,
):
    """The OpenAI-compatible front on config.http_port, over the same core as the gRPC servicer."""
    from salon.gateway.http.app import HttpLimits, HttpServer, build_app
    from salon.gateway.http.catalog import ModelCatalog
    from salon.gateway.http.routes import Front

    front = Front(tenants, admission, dispatcher, ModelCatalog(pools), grants, config.opening_max_bytes)
    limits = HttpLimits(
        max_body_bytes=config.http_max_body_bytes,
        header_timeout_s=config.http_header_timeout_s,
        body_timeout_s=config.http_body_timeout_s,
        idle_timeout_s=config.http_idle_timeout_s,
        max_connections=config.http_max_connections,
    )
    return HttpServer(build_app(front, limits), config.server.host, config.http_port, config.server.grace_s, limits)


class GatewayService:
    name = "gateway"
    # The public port: tenants authenticate per call (API keys); the inbound trace context is ignored.
    access_policy = None

    def __init__(self, config: GatewayConfig):
        self.config = config
        self.tenants = build_tenants(config)
        self.endpoints = parse_engine_list(config.engines)
        self.settings = pool_settings(config)
        self.dispatch_settings = dispatch_settings(config)
        if not self.endpoints and self.settings.dns_name is None:
            raise ValueError("no engines: give --engines and/or --engines-dns")
        self.policy = make_policy(config.routing_policy, config.load_factor, config.min_capacity_streams)
        self.grants = Grants(
            namespace_grant.load_key(config.namespace_grant_key_file) if config.namespace_grant_key_file else None
        )
        self.pool: EnginePool | None = None
        self.pools: ModelPools | None = None
        self.sessions: SessionTable | None = None
        self.dispatcher: Dispatcher | None = None
        self._ready_task: asyncio.Task | None = None
        self.http = None
        # Ports besides gRPC and metrics, printed in the LISTENING line (salon/common/server.py).
        self.listening_ports: dict[str, int] = {}

    async def start(self, server: grpc.aio.Server, health: HealthState) -> list[str]:
        internal_auth.check_client(
            self.config.server.internal_auth,
            self.settings.tls,
            "--engine-tls",
            [e.address for e in self.endpoints],
            any_target=self.settings.dns_name is not None,
        )
        if not self.tenants.tenants and self.tenants.anonymous is None:
            log.warning("no_tenants", detail="every call will be refused UNAUTHENTICATED")
        self.sessions = build_sessions(self.config)
        self.pool = EnginePool(self.endpoints, self.settings)
        config = self.config
        self.pools = ModelPools(
            self.pool,
            lambda: make_policy(config.routing_policy, config.load_factor, config.min_capacity_streams),
            config.default_model,
            config.model_info_ttl_s,
        )
        self.dispatcher = Dispatcher(self.pool, self.policy, self.sessions, self.dispatch_settings, self.pools)
        servicer = ChatServicer(
            self.tenants,
            AdmissionControl(concurrency_retry_after_ms=self.config.concurrency_retry_after_ms),
            self.dispatcher,
            self.pools,
            self.grants,
        )
        chat_pb2_grpc.add_ChatServiceServicer_to_server(servicer, server)
        self.pool.start()
        if self.config.http_port is not None:
            self.http = build_http_server(
                self.config, self.tenants, servicer.admission, self.dispatcher, self.pools, self.grants
            )
            self.http.start()
            self.listening_ports["http_port"] = self.http.port
        self._ready_task = asyncio.create_task(self._serve_when_routable(health))
        log.info(
            "gateway_config",
            engines=[e.engine_id for e in self.endpoints],
            dns=self.config.engines_dns,
            policy=self.policy.name,
            sessions="redis" if self.config.redis_url else "memory",
            tenants=[t.tenant_id for t in self.tenants.tenants],
        )
        return [chat_pb2.DESCRIPTOR.services_by_name["ChatService"].full_name]

    async def _serve_when_routable(self, health: HealthState) -> None:
        """Report SERVING once some engine can take work; from then on failures are per request."""
        assert self.pool is not None
        assert self.pools is not None
        await self.pool.wait_for(
            lambda loads: any(load.accepting for load in loads.values()) and bool(self.pools.models()), timeout_s=1e9
        )
        await health.set_serving()
        log.info("gateway_serving")

    async def stop_accepting(self) -> None:
        """Stop the HTTP front (its streams get the grace period) before the gRPC server stops."""
        if self.http is not None:
            await self.http.stop()

    async def stop(self) -> None:
        if self._ready_task is not None:
            self._ready_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ready_task
        if self.dispatcher is not None:
            await self.dispatcher.close()
        if self.pool is not None:
            await self.pool.stop()
        if self.sessions is not None:
            await self.sessions.close()
