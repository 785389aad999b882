"""Engine pool: health and draining move engines in and out of the ring; DNS discovery.

The engines here are in-process gRPC servers on loopback with the real grpc.health.v1 servicer and a
scripted EngineService.WatchLoad, because the transitions under test (NOT_SERVING and back, draining
reports) are driven by the test; the process tests use real engines.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from prometheus_client import REGISTRY

from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.gateway.membership import EngineEndpoint, EnginePool, PoolSettings, parse_engine_list
from salon.gateway.types import EngineId


class ScriptedEngine(engine_pb2_grpc.EngineServiceServicer):
    def __init__(self, engine_id: str):
        self.engine_id = engine_id
        self.report = engine_pb2.LoadReport(engine_id=engine_id, max_waiting_requests=10)
        self.changed = asyncio.Event()
        # Optional Generate implementation (async generator function) used by the dispatcher tests.
        self.generate = None

    async def Generate(self, request, context):
        async for event in self.generate(request, context):
            yield event

    def set_report(self, **fields) -> None:
        for name, value in fields.items():
            setattr(self.report, name, value)
        self.changed.set()

    async def WatchLoad(self, request, context):
        while True:
            yield engine_pb2.WatchLoadResponse(load=self.report)
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), request.interval_ms / 1000)
            except TimeoutError:
                pass


async def start_engine(engine_id: str, host: str = "127.0.0.1"):
    server = grpc.aio.server()
    engine = ScriptedEngine(engine_id)
    health = HealthServicer()
    engine_pb2_grpc.add_EngineServiceServicer_to_server(engine, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, engine, health, port


def accepting(pool: EnginePool) -> set[str]:
    return {e for e, load in pool.snapshot().items() if load.accepting}


async def test_health_and_draining_move_engines_in_and_out() -> None:
    servers = [await start_engine(f"e{i}") for i in range(2)]
    pool = EnginePool(
        [EngineEndpoint(f"127.0.0.1:{port}", EngineId(f"e{i}")) for i, (_, _, _, port) in enumerate(servers)],
        PoolSettings(load_interval_ms=50),
    )
    pool.start()
    try:
        await pool.wait_for(lambda s: accepting(pool) == {"e0", "e1"}, timeout_s=5)
        _, engine1, health1, _ = servers[1]
        # NOT_SERVING: out of the ring at once; SERVING: back.
        await health1.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await pool.wait_for(lambda s: accepting(pool) == {"e0"}, timeout_s=2)
        await health1.set("", health_pb2.HealthCheckResponse.SERVING)
        await pool.wait_for(lambda s: accepting(pool) == {"e0", "e1"}, timeout_s=2)
        # Draining: still SERVING, but takes no new dialogues.
        engine1.set_report(draining=True)
        await pool.wait_for(lambda s: accepting(pool) == {"e0"}, timeout_s=2)
        engine1.set_report(draining=False, running_requests=3, waiting_requests=10)
        await pool.wait_for(lambda s: accepting(pool) == {"e0", "e1"}, timeout_s=2)
        load = pool.snapshot()[EngineId("e1")]
        assert (load.num_active_requests, load.saturated) == (13, True)
        # A stream failure takes it out until the re-opened health watch says SERVING.
        handle = pool.by_id(EngineId("e1"))
        handle.mark_failed("test")
        assert accepting(pool) == {"e0"}
        await pool.wait_for(lambda s: accepting(pool) == {"e0", "e1"}, timeout_s=2)
        # Killed: out of the ring.
        await servers[0][0].stop(None)
        await pool.wait_for(lambda s: accepting(pool) == {"e1"}, timeout_s=5)
    finally:
        await pool.stop()
        for server, *_ in servers:
            await server.stop(None)


async def test_serving_gauge_waits_for_the_engines_model() -> None:
    """`salon_gateway_engine_serving` says "a member of its model's ring": SERVING by health is not enough, the
    engine is in no model's pool until a LoadReport names its model (model_pools.py). A gauge of 1 before that
    let a client (and the process tests) send a dialogue while its ring owner was still outside the ring."""
    server, engine, health, port = await start_engine("gauge-e0")
    pool = EnginePool([EngineEndpoint(f"127.0.0.1:{port}", EngineId("gauge-e0"))], PoolSettings(load_interval_ms=50))

    def gauge() -> float | None:
        return REGISTRY.get_sample_value("salon_gateway_engine_serving", {"engine": "gauge-e0"})

    pool.start()
    try:
        handle = pool.by_id(EngineId("gauge-e0"))
        await pool.wait_for(lambda s: accepting(pool) == {"gauge-e0"}, timeout_s=5)
        for _ in range(100):  # a report without a model changes no membership, so poll for it
            if handle.report is not None:
                break
            await asyncio.sleep(0.05)
        assert handle.report is not None and not handle.report.model_id, "no LoadReport without a model arrived"
        assert (handle.routable, gauge()) == (False, 0.0)
        engine.set_report(model_id="m")
        await pool.wait_for(lambda s: handle.routable, timeout_s=2)
        assert gauge() == 1.0
        await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await pool.wait_for(lambda s: not accepting(pool), timeout_s=2)
        assert (handle.routable, gauge()) == (False, 0.0)
    finally:
        await pool.stop()
        await server.stop(None)


async def test_dns_discovery_learns_engine_ids() -> None:
    server, _, _, port = await start_engine("dns-engine")
    pool = EnginePool([], PoolSettings(load_interval_ms=50, dns_name="localhost", dns_port=port, dns_interval_s=0.1))
    pool.start()
    try:
        await pool.wait_for(lambda s: accepting(pool) == {"dns-engine"}, timeout_s=5)
        assert f"127.0.0.1:{port}" in {h.address for h in pool.handles()}
        # A name that stops resolving keeps the last known set (a resolver hiccup must not empty the ring).
        pool.settings = PoolSettings(dns_name="no-such-host.invalid", dns_port=port)
        await pool.resolve_dns_once()
        assert accepting(pool) == {"dns-engine"}
    finally:
        await pool.stop()
        await server.stop(None)


def test_parse_engine_list() -> None:
    assert parse_engine_list("e0=127.0.0.1:1, e1=h:2,") == [
        EngineEndpoint("127.0.0.1:1", EngineId("e0")),
        EngineEndpoint("h:2", EngineId("e1")),
    ]
    for bad in ["e0", "=h:1", "e0=h", "e0=h:1,e0=h:2"]:
        with pytest.raises(ValueError, match="engines"):
            parse_engine_list(bad)
