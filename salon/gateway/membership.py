"""Which engines exist, which may take work, and how loaded they are.

Engines come from the config (`engine_id=host:port`) and, optionally, from DNS: a headless-service
name resolved every `dns_interval_s` to a set of addresses (an engine found through DNS learns its
id from its first LoadReport). For each engine the pool keeps one channel and two watch streams:

    grpc.health.v1 Health.Watch ──> serving      (SERVING ⇔ member of the ring; polls Check instead
                                                  if the engine cannot stream Watch)
    EngineService.WatchLoad     ──> last report  (running + waiting requests, draining flag, the model it
                                                  serves: its pool, model_pools.py; resident memory)

A hung engine (stopped, or its event loop blocked) keeps its connection open and says nothing: a
health Watch stream only speaks on a change, so silence is judged from the load reports, which come
every `load_interval_ms`. An engine that has reported and then sends none for `stale_after_s` is
*silent*: it leaves the ring (new dialogues and failovers go elsewhere, streams waiting for its first
token move on, dispatch.py) and returns with its next report; its dialogues' sessions still name it,
so their next turns go back to it. (Polled health, for engines without Watch, fails by its own
timeout.)

Invariants:
  * an engine is `accepting` (a ring member) iff its latest health status is SERVING, it has an id,
    its last LoadReport does not say draining, its load reports are not stale, and no stream has
    failed on it since that status;
  * a watch stream that breaks marks the engine not serving at once and is re-opened with backoff;
    the engine returns to the ring only when a re-opened Watch (or Check poll) says SERVING again;
  * `num_inflight` counts this gateway's open Generate streams to the engine (routing load).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.channel import create_channel
from salon.common.client_tls import ClientTLS
from salon.common.logging import get_logger
from salon.gateway import metrics
from salon.gateway.routing import EngineLoad
from salon.gateway.types import EngineId

log = get_logger(__name__)

# An engine silent this long (no load report) leaves the ring: several report intervals at the default
# 250 ms, and beyond a busy host's scheduling hiccups.
ENGINE_STALE_AFTER_S = 3.0
_BACKOFF_INITIAL_S = 0.05
_BACKOFF_MAX_S = 2.0
_SERVING = health_pb2.HealthCheckResponse.SERVING
# Watch failures that mean "this server cannot stream health", not "this server is down".
_WATCH_UNSUPPORTED = frozenset({grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})


def _status_name(status: int) -> str:
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)


@dataclass(frozen=True)
class EngineEndpoint:
    address: str  # host:port
    engine_id: EngineId | None  # None: learned from the engine's LoadReport (DNS discovery)


@dataclass(frozen=True)
class PoolSettings:
    health_service: str = ""  # grpc.health.v1 service name to watch ("" = the whole server)
    health_poll_interval_s: float = 0.25  # Check period for engines whose Watch does not work
    load_interval_ms: int = 250  # WatchLoad report interval
    # An engine whose load reports stop for this long leaves the ring until it reports again (0: never).
    stale_after_s: float = ENGINE_STALE_AFTER_S
    dns_name: str | None = None  # headless-service name to resolve, or None
    dns_port: int = 50051
    dns_interval_s: float = 5.0
    tls: ClientTLS | None = None


class EngineHandle:
    """One engine: its channel, stubs and what the watches last said."""

    def __init__(self, endpoint: EngineEndpoint, settings: PoolSettings, on_change: Callable[[], None]):
        self.address = endpoint.address
        self.configured_id = endpoint.engine_id
        self.engine_id: EngineId | None = endpoint.engine_id
        self.settings = settings
        self.channel = create_channel(endpoint.address, settings.tls)
        self.stub = engine_pb2_grpc.EngineServiceStub(self.channel)
        # Generate with the events parsed straight into the public message type: the engine's
        # GenerateResponse is wire-identical to salon.chat.v1.GenerateResponse (same field numbers and
        # types, checked by tests/gateway/test_gateway_wire.py), so events pass through untranslated.
        # Its channel has no tracing interceptor: the dispatcher passes the trace context itself
        # (call_trace.py). Same target and options, so gRPC shares one connection between the two.
        self._generate_channel = create_channel(endpoint.address, settings.tls, traced=False)
        self.generate = self._generate_channel.unary_stream(
            "/salon.engine.v1.EngineService/Generate",
            request_serializer=engine_pb2.GenerateRequest.SerializeToString,
            response_deserializer=chat_pb2.GenerateResponse.FromString,
        )
        self._health_stub = health_pb2_grpc.HealthStub(self.channel)
        self._on_change = on_change
        self.serving = False
        self.report: engine_pb2.LoadReport | None = None
        self.num_inflight = 0
        # False while the load reports are stale (the engine is silent); set again by the next report.
        self.reports_fresh = True
        # Set while the engine is silent: streams waiting for its first token wait on it too.
        self.silent = asyncio.Event()
        # time.monotonic() of the last report whose queue held waiting requests (dispatch.py: time spent
        # queued behind other requests does not count against the first-token timeout).
        self.queue_seen_s = 0.0
        self._stale_timer: asyncio.TimerHandle | None = None
        self._poll_health = False
        self._health_task: asyncio.Task | None = None
        self._load_task: asyncio.Task | None = None

    @property
    def draining(self) -> bool:
        return self.report is not None and self.report.draining

    @property
    def accepting(self) -> bool:
        return self.serving and self.reports_fresh and not self.draining and self.engine_id is not None

    @property
    def routable(self) -> bool:
        """Accepting and in a model's pool (model_pools.py: an engine joins one with its first LoadReport that
        names its model): a member of a ring, what `salon_gateway_engine_serving` shows."""
        return self.accepting and self.report is not None and bool(self.report.model_id)

    def load(self) -> EngineLoad:
        assert self.engine_id is not None
        reported = 0
        saturated = False
        if self.report is not None:
            reported = self.report.running_requests + self.report.waiting_requests
            saturated = (
                self.report.max_waiting_requests > 0
                and self.report.waiting_requests >= self.report.max_waiting_requests
            )
        return EngineLoad(
            engine_id=self.engine_id,
            num_active_requests=max(self.num_inflight, reported),
            accepting=self.accepting,
            saturated=saturated,
        )

    def start(self) -> None:
        self._health_task = asyncio.create_task(self._watch_health(), name=f"health:{self.address}")
        self._load_task = asyncio.create_task(self._watch_load(), name=f"load:{self.address}")

    async def close(self) -> None:
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        for task in (self._health_task, self._load_task):
            if task is not None:
                task.cancel()
        for task in (self._health_task, self._load_task):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._set_serving(False, "closed")
        await self.channel.close()
        await self._generate_channel.close()

    def mark_failed(self, reason: str) -> None:
        """A stream to this engine failed: leave the ring now; re-open the health watch to come back."""
        self._set_serving(False, reason)
        if self._health_task is not None and not self._health_task.done():
            self._health_task.cancel()
            # A fresh context: this is called inside a request, whose log fields and trace span the
            # long-lived watch must not inherit.
            self._health_task = asyncio.create_task(
                self._watch_health(), name=f"health:{self.address}", context=contextvars.Context()
            )

    def _set_serving(self, serving: bool, reason: str) -> None:
        if serving == self.serving:
            return
        self.serving = serving
        log.info("engine_health", engine=self.engine_id, address=self.address, serving=serving, reason=reason)
        self._publish()

    def _publish(self) -> None:
        if self.engine_id is not None:
            metrics.ENGINE_SERVING.labels(engine=self.engine_id).set(1 if self.routable else 0)
        self._on_change()

    async def _watch_health(self) -> None:
        backoff_s = _BACKOFF_INITIAL_S
        request = health_pb2.HealthCheckRequest(service=self.settings.health_service)
        while True:
            try:
                if self._poll_health:
                    await self._poll_health_once(request)
                    await asyncio.sleep(self.settings.health_poll_interval_s)
                    backoff_s = _BACKOFF_INITIAL_S
                    continue
                async for response in self._health_stub.Watch(request):
                    backoff_s = _BACKOFF_INITIAL_S
                    self._set_serving(response.status == _SERVING, _status_name(response.status))
                self._set_serving(False, "health watch ended")
            except grpc.aio.AioRpcError as exc:
                self._set_serving(False, f"health {exc.code().name}")
                if exc.code() in _WATCH_UNSUPPORTED and not self._poll_health:
                    # The engine answers Check but cannot stream Watch: poll Check instead.
                    log.warning(
                        "health_watch_unsupported",
                        address=self.address,
                        code=exc.code().name,
                        poll_interval_s=self.settings.health_poll_interval_s,
                    )
                    self._poll_health = True
                    continue
            await asyncio.sleep(backoff_s)
            backoff_s = min(_BACKOFF_MAX_S, backoff_s * 2)

    async def _poll_health_once(self, request: health_pb2.HealthCheckRequest) -> None:
        response = await self._health_stub.Check(request, timeout=max(1.0, self.settings.health_poll_interval_s))
        self._set_serving(response.status == _SERVING, _status_name(response.status))

    async def _watch_load(self) -> None:
        backoff_s = _BACKOFF_INITIAL_S
        request = engine_pb2.WatchLoadRequest(interval_ms=self.settings.load_interval_ms)
        while True:
            try:
                async for response in self.stub.WatchLoad(request):
                    backoff_s = _BACKOFF_INITIAL_S
                    self._take_report(response.load)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    log.warning("load_watch_failed", address=self.address, code=exc.code().name)
            await asyncio.sleep(backoff_s)
            backoff_s = min(_BACKOFF_MAX_S, backoff_s * 2)

    def _arm_stale_timer(self) -> None:
        if self.settings.stale_after_s <= 0:
            return
        if self._stale_timer is not None:
            self._stale_timer.cancel()
        self._stale_timer = asyncio.get_running_loop().call_later(self.settings.stale_after_s, self._go_stale)

    def _go_stale(self) -> None:
        """No load report for stale_after_s: the engine is silent and leaves the ring."""
        self._stale_timer = None
        was_accepting = self.accepting
        self.reports_fresh = False
        self.silent.set()
        metrics.ENGINE_STALE.labels(engine=self.engine_id or self.address).inc()
        log.warning(
            "engine_silent", engine=self.engine_id, address=self.address, stale_after_s=self.settings.stale_after_s
        )
        if was_accepting:
            self._publish()

    def _take_report(self, report: engine_pb2.LoadReport) -> None:
        self._arm_stale_timer()
        if report.waiting_requests:
            self.queue_seen_s = time.monotonic()
        was_accepting, was_id = self.accepting, self.engine_id
        if not self.reports_fresh:
            self.reports_fresh = True
            self.silent.clear()
            log.info("engine_reporting_again", engine=self.engine_id, address=self.address)
        was_model = self.report.model_id if self.report is not None else ""
        if report.engine_id and self.configured_id is None:
            self.engine_id = EngineId(report.engine_id)
        elif report.engine_id and report.engine_id != self.configured_id:
            log.warning(
                "engine_id_mismatch", configured=self.configured_id, reported=report.engine_id, address=self.address
            )
        if report.draining != self.draining:
            log.info("engine_draining", engine=self.engine_id, draining=report.draining)
        self.report = report
        if was_accepting != self.accepting or was_id != self.engine_id or was_model != report.model_id:
            self._publish()


class EnginePool:
    """All known engines, keyed by address; routing sees them by engine id."""

    def __init__(self, endpoints: Iterable[EngineEndpoint], settings: PoolSettings):
        self.settings = settings
        self._static = list(endpoints)
        self._handles: dict[str, EngineHandle] = {}
        self._dns_task: asyncio.Task | None = None
        # Set whenever membership or health changes (tests and `wait_for` use it).
        self.changed = asyncio.Event()

    def _notify(self) -> None:
        self.changed.set()

    def start(self) -> None:
        for endpoint in self._static:
            self._add(endpoint)
        if self.settings.dns_name:
            self._dns_task = asyncio.create_task(self._resolve_forever(), name="dns")

    async def stop(self) -> None:
        if self._dns_task is not None:
            self._dns_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dns_task
        handles, self._handles = list(self._handles.values()), {}
        await asyncio.gather(*(h.close() for h in handles))

    def _add(self, endpoint: EngineEndpoint) -> None:
        if endpoint.address in self._handles:
            return
        handle = EngineHandle(endpoint, self.settings, self._notify)
        self._handles[endpoint.address] = handle
        handle.start()
        log.info("engine_added", engine=endpoint.engine_id, address=endpoint.address)

    async def _remove(self, address: str) -> None:
        handle = self._handles.pop(address, None)
        if handle is not None:
            log.info("engine_removed", engine=handle.engine_id, address=address)
            await handle.close()

    def handles(self) -> list[EngineHandle]:
        return list(self._handles.values())

    def by_id(self, engine_id: EngineId) -> EngineHandle | None:
        for handle in self._handles.values():
            if handle.engine_id == engine_id:
                return handle
        return None

    def snapshot(self) -> dict[EngineId, EngineLoad]:
        """Loads of every engine with a known id. If two addresses claim one id, an accepting one wins."""
        loads: dict[EngineId, EngineLoad] = {}
        for handle in self._handles.values():
            if handle.engine_id is None:
                continue
            current = loads.get(handle.engine_id)
            if current is None or (handle.accepting and not current.accepting):
                loads[handle.engine_id] = handle.load()
        return loads

    async def wait_for(self, predicate: Callable[[dict[EngineId, EngineLoad]], bool], timeout_s: float) -> None:
        """Wait until `predicate(snapshot())` holds (asyncio.TimeoutError after timeout_s)."""

        async def _wait() -> None:
            while not predicate(self.snapshot()):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(_wait(), timeout_s)

    async def resolve_dns_once(self) -> None:
        name, port = self.settings.dns_name, self.settings.dns_port
        assert name is not None
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            # Keep the current set: a resolver hiccup must not empty the ring.
            log.warning("dns_resolve_failed", name=name, error=str(exc))
            return
        addresses = {_format_address(info[4][0], info[4][1]) for info in infos}
        static = {e.address for e in self._static}
        for address in sorted(addresses - self._handles.keys()):
            self._add(EngineEndpoint(address=address, engine_id=None))
        for address in sorted(self._handles.keys() - addresses - static):
            await self._remove(address)

    async def _resolve_forever(self) -> None:
        while True:
            await self.resolve_dns_once()
            await asyncio.sleep(self.settings.dns_interval_s)


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_engine_list(text: str) -> list[EngineEndpoint]:
    """`e0=127.0.0.1:50051,e1=10.0.0.2:50051` -> endpoints (ids must be unique)."""
    endpoints: list[EngineEndpoint] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        engine_id, sep, address = item.partition("=")
        if not sep or not engine_id or ":" not in address:
            raise ValueError(f"engines: expected id=host:port, got {item!r}")
        endpoints.append(EngineEndpoint(address=address.strip(), engine_id=EngineId(engine_id.strip())))
    ids = [e.engine_id for e in endpoints]
    if len(set(ids)) != len(ids):
        raise ValueError("engines: engine ids must be unique")
    return endpoints
