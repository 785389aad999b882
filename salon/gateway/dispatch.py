"""One reply's journey through the gateway: pick an engine, stream from it, fail over if it dies.

    route (session table + policy) ──> EngineService.Generate ──> events to the client
          ^                                   │ UNAVAILABLE / CANCELLED by the engine /
          └── exclude the failed engine ◄─────┘ stream ended without a final
              resume_token_ids = every token already sent to the client

Invariants:
  * the client sees each generated token exactly once: on failover the next engine receives every
    token already forwarded as `resume_token_ids` and streams only what comes after them;
  * at most one engine call is open per reply; it is cancelled whenever this generator stops
    (client cancel, deadline, error), which aborts the engine's work;
  * events are pulled from the engine one at a time and handed to the client before the next is
    read, so a slow client slows the engine stream (gRPC flow control) instead of filling a buffer;
  * `EngineHandle.num_inflight` is incremented exactly once per engine call and decremented when it
    ends, whatever the outcome.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2
from salon.common.errors import RETRY_AFTER_METADATA_KEY, SalonError, Unavailable
from salon.common.logging import get_logger
from salon.gateway import metrics
from salon.gateway.call_trace import CallTrace
from salon.gateway.membership import EnginePool
from salon.gateway.model_pools import ModelPools
from salon.gateway.routing import RouteDecision, RoutingPolicy
from salon.gateway.sessions import SessionTable
from salon.gateway.types import DialogueKey, EngineId, TenantId, dialogue_key

log = get_logger(__name__)

# Engine failures after which the stream moves to another engine. CANCELLED reaches us only when the
# engine side cancelled (our own cancellation arrives as asyncio.CancelledError instead).
_FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
_ENGINE_GENERATE_METHOD = "/salon.engine.v1.EngineService/Generate"


class UpstreamError(SalonError):
    """An engine's own error status, passed to the client unchanged (with its retry hint)."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: str | None = None):
        super().__init__(message)
        self.code = code
        self._retry_after_ms = retry_after_ms

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((RETRY_AFTER_METADATA_KEY, self._retry_after_ms),) if self._retry_after_ms else ()


@dataclass(frozen=True)
class DispatchSettings:
    # Moves to another engine after mid-stream failures before the client gets UNAVAILABLE.
    max_failovers: int = 2
    # Extra engines tried when an engine refuses a new request (RESOURCE_EXHAUSTED) before any token.
    max_refusal_retries: int = 1


class _EngineFailed(Exception):
    def __init__(self, engine_id: EngineId, reason: str):
        super().__init__(reason)
        self.engine_id = engine_id
        self.reason = reason


class _EngineMetrics:
    """One engine's metric children, bound once rather than looked up by label on every reply."""

    __slots__ = ("_engine_id", "inflight", "_ok_by_tenant")

    def __init__(self, engine_id: EngineId):
        self._engine_id = engine_id
        self.inflight = metrics.ENGINE_INFLIGHT.labels(engine=engine_id)
        self._ok_by_tenant: dict[TenantId, Any] = {}

    def ok(self, tenant_id: TenantId):
        """The counter of this engine's replies to `tenant_id` that ended OK."""
        child = self._ok_by_tenant.get(tenant_id)
        if child is None:
            child = self._ok_by_tenant[tenant_id] = metrics.REQUESTS.labels(
                engine=self._engine_id, tenant=tenant_id, code="OK")
        return child


class Dispatcher:
    """Routes each reply within its model's pool (`pools`, one policy each); without pools, over every engine
    with `policy`."""

    def __init__(self, pool: EnginePool, policy: RoutingPolicy, sessions: SessionTable, settings: DispatchSettings,
                 pools: ModelPools | None = None):
        self.pool = pool
        self.policy = policy
        self.sessions = sessions
        self.settings = settings
        self.pools = pools
        self._background: set[asyncio.Task] = set()
        self._metrics_by_engine: dict[EngineId, _EngineMetrics] = {}

    def _engine_metrics(self, engine_id: EngineId) -> _EngineMetrics:
        engine_metrics = self._metrics_by_engine.get(engine_id)
        if engine_metrics is None:
            engine_metrics = self._metrics_by_engine[engine_id] = _EngineMetrics(engine_id)
        return engine_metrics

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def _record(self, key: DialogueKey, engine_id: EngineId) -> None:
        """Write a session entry nobody waits for: inline for a local table, in a task for a remote one."""
        if not self.sessions.remote:
            await self.sessions.put(key, engine_id)
            return
        task = asyncio.create_task(self.sessions.put(key, engine_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _choose(self, model: str, key: DialogueKey, sticky: EngineId | None,
                exclude: set[EngineId]) -> RouteDecision | None:
        if self.pools is None:
            return self.policy.choose(key, self.pool.snapshot(), sticky, frozenset(exclude))
        return self.pools.policy(model).choose(key, self.pools.snapshot(model), sticky, frozenset(exclude))

    def _route(self, model: str, key: DialogueKey, sticky: EngineId | None, exclude: set[EngineId]) -> RouteDecision:
        decision = self._choose(model, key, sticky, exclude)
        if decision is None:
            metrics.REFUSALS.labels(reason="no_engine").inc()
            raise Unavailable(f"no engine of {model} is serving; retry shortly" if self.pools is not None
                              else "no engine is serving; retry shortly")
        return decision

    async def _place(self, model: str, key: DialogueKey) -> RouteDecision:
        """First placement of a reply: session table, then policy, then record where it went."""
        sticky = await self.sessions.get(key)
        decision = self._route(model, key, sticky, set())
        if sticky is None:
            holder = await self.sessions.claim(key, decision.engine_id)
            if holder != decision.engine_id:
                # Another gateway replica placed this dialogue a moment ago: follow it if we can.
                decision = self._route(model, key, holder, set())
                if decision.engine_id != holder:
                    await self._record(key, decision.engine_id)
        else:
            # Refreshes the TTL on a sticky hit; records the move otherwise.
            await self._record(key, decision.engine_id)
        if decision.sticky_hit:
            metrics.ROUTED_STICKY.inc()
        elif decision.moved:
            metrics.ROUTED_MOVE.inc()
        elif decision.spilled:
            metrics.ROUTED_SPILL.inc()
        else:
            metrics.ROUTED_HOME.inc()
        if decision.spilled:
            metrics.SPILLS.inc()
        return decision

    async def stream(
        self,
        request: engine_pb2.GenerateRequest,
        tenant_id: TenantId,
        deadline_s: float | None,
        arrived_s: float,
        model: str = "",
        reply_request_id: str = "",
    ) -> AsyncIterator[chat_pb2.GenerateResponse]:
        """Yield the reply's events. `deadline_s` is absolute (time.monotonic), None for no deadline;
        `model`: the served model whose pool serves the reply (with pools) and the latency metrics' label;
        reply_request_id: the id GenerateFinal reports (the caller's own; default the engine request's)."""
        reply_request_id = reply_request_id or request.request_id
        key = dialogue_key(tenant_id, request.conversation_id)
        decision = await self._place(model, key)
        exclude: set[EngineId] = set()
        forwarded_token_ids: list[int] = []
        num_failovers = 0
        num_refusals = 0
        first_token_seen = False
        engine_id = decision.engine_id
        while True:
            handle = self.pool.by_id(engine_id)
            if handle is None:  # removed between routing and now
                exclude.add(engine_id)
                engine_id = self._route(model, key, None, exclude).engine_id
                continue
            # The request is ours (built by the servicer): each attempt resumes after what was sent.
            if forwarded_token_ids:
                request.resume_token_ids[:] = forwarded_token_ids
            timeout_s = None if deadline_s is None else max(0.001, deadline_s - time.monotonic())
            if num_failovers == 0 and num_refusals == 0:
                metrics.ADDED_LATENCY.labels(model).observe(time.perf_counter() - arrived_s)
            handle.num_inflight += 1
            engine_metrics = self._engine_metrics(engine_id)
            engine_metrics.inflight.inc()
            call_trace = CallTrace(_ENGINE_GENERATE_METHOD)
            call_code, call_details = grpc.StatusCode.CANCELLED, None  # until the call says otherwise
            call = handle.generate(request, timeout=timeout_s, metadata=call_trace.metadata)
            try:
                finished = False
                async for event in call:
                    if finished:
                        continue  # nothing follows a final event: read the stream to its end
                    if event.HasField("final"):
                        call_code = grpc.StatusCode.OK  # the reply is whole, whatever follows it
                        self._finish(event.final, reply_request_id, forwarded_token_ids, num_failovers, engine_id)
                        engine_metrics.ok(tenant_id).inc()
                        yield event
                        # Let the call complete normally (its trace span ends with the stream).
                        finished = True
                        continue
                    forwarded_token_ids.extend(event.delta.token_ids)
                    if not first_token_seen and event.delta.token_ids:
                        first_token_seen = True
                        metrics.TIME_TO_FIRST_TOKEN.labels(model).observe(time.perf_counter() - arrived_s)
                    yield event
                call_code = grpc.StatusCode.OK
                if finished:
                    return
                raise _EngineFailed(engine_id, "stream ended without a final event")
            except grpc.aio.AioRpcError as exc:
                code = call_code = exc.code()
                call_details = exc.details()
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and not forwarded_token_ids \
                        and num_refusals < self.settings.max_refusal_retries:
                    num_refusals += 1
                    exclude.add(engine_id)
                    next_engine = self._choose(model, key, None, exclude)
                    if next_engine is not None:
                        metrics.SPILLS.inc()
                        engine_id = next_engine.engine_id
                        continue
                if code not in _FAILOVER_CODES:
                    metrics.REQUESTS.labels(engine=engine_id, tenant=tenant_id, code=code.name).inc()
                    retry_after = dict(exc.trailing_metadata() or ()).get(RETRY_AFTER_METADATA_KEY)
                    raise UpstreamError(code, exc.details() or code.name, retry_after) from None
                failure = _EngineFailed(engine_id, f"{code.name}: {exc.details()}")
            except _EngineFailed as exc:
                failure = exc
            finally:
                call.cancel()
                call_trace.end(call_code, call_details)
                handle.num_inflight -= 1
                engine_metrics.inflight.dec()

            # The engine failed mid-stream (or before streaming): move to the next one.
            handle.mark_failed(failure.reason)
            metrics.FAILOVERS.labels(from_engine=failure.engine_id).inc()
            if num_failovers >= self.settings.max_failovers:
                metrics.REQUESTS.labels(engine=engine_id, tenant=tenant_id, code="UNAVAILABLE").inc()
                raise Unavailable(f"engine {engine_id} failed ({failure.reason}) and failover limit reached")
            num_failovers += 1
            max_new_tokens = request.sampling.max_new_tokens
            if max_new_tokens and len(forwarded_token_ids) >= max_new_tokens:
                # Every token was sent; only the final event was lost. Nothing is left to resume.
                final = chat_pb2.GenerateFinal(finish_reason=chat_pb2.FINISH_REASON_LENGTH, engine_id=engine_id)
                self._finish(final, reply_request_id, forwarded_token_ids, num_failovers, engine_id)
                metrics.REQUESTS.labels(engine=engine_id, tenant=tenant_id, code="OK").inc()
                yield chat_pb2.GenerateResponse(final=final)
                return
            exclude.add(engine_id)
            engine_id = self._route(model, key, None, exclude).engine_id
            await self._record(key, engine_id)
            log.warning("failover", from_engine=failure.engine_id, to_engine=engine_id, reason=failure.reason,
                        num_resume_tokens=len(forwarded_token_ids))

    @staticmethod
    def _finish(
        final: chat_pb2.GenerateFinal,
        reply_request_id: str,
        forwarded_token_ids: list[int],
        num_failovers: int,
        engine_id: EngineId,
    ) -> None:
        """Make the final event describe the whole reply, across failovers."""
        final.failovers = num_failovers
        final.request_id = reply_request_id
        if not final.engine_id:
            final.engine_id = engine_id
        if num_failovers:
            # The engines count resumed tokens as generated; the gateway's count is the reply as sent.
            final.usage.generated_tokens = len(forwarded_token_ids)
