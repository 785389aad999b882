"""One reply's journey through the gateway: pick an engine, stream from it, fail over if it dies.

    route (session table + policy) ──> EngineService.Generate ──> events to the client
          ^                                   │ UNAVAILABLE / CANCELLED by the engine /
          └── exclude the failed engine ◄─────┘ stream ended without a final /
              resume_token_ids = every token    the engine silent past a bound (stall_watch.py)
              already sent to the client

Two parts: an attempt (`Dispatcher._attempt`) streams from one engine and reports how it ended; the
failover policy (`Dispatcher.stream` with `_spill_refusal`, `_fail_over`) picks the next engine, sets
the resume tokens and decides when to give up.

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
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2
from salon.common.errors import RETRY_AFTER_METADATA_KEY, SalonError, Unavailable
from salon.common.logging import get_logger
from salon.gateway import metrics
from salon.gateway.call_trace import CallTrace
from salon.gateway.membership import EngineHandle, EnginePool
from salon.gateway.model_pools import ModelPools
from salon.gateway.routing import RouteDecision, RoutingPolicy
from salon.gateway.sessions import SessionTable
from salon.gateway.stall_watch import EngineStalled, StallTimeouts, first_event, next_event
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
    # How long an engine stream may stay silent before it fails over (stall_watch.py).
    stall: StallTimeouts = field(default_factory=StallTimeouts)


@dataclass
class _Reply:
    """One reply's state across its engine calls: what the failover policy decides from, and what each
    attempt resumes after."""

    request: engine_pb2.GenerateRequest
    tenant_id: TenantId
    model: str
    key: DialogueKey
    deadline_s: float | None
    arrived_s: float
    reply_request_id: str
    # The engine of the current (or next) attempt.
    engine_id: EngineId
    # Every token already sent to the client: the next engine's resume_token_ids.
    forwarded_token_ids: list[int] = field(default_factory=list)
    # Engines this reply must not go to again (refused it or failed).
    exclude: set[EngineId] = field(default_factory=set)
    num_failovers: int = 0
    num_refusals: int = 0
    first_token_seen: bool = False


@dataclass
class _AttemptEnd:
    """How one attempt ended: `finished` (the final event went to the client), else `rejected` (the
    engine's own error status: a refusal or an error for the client) or `failure` (why to fail over)."""

    finished: bool = False
    rejected: grpc.aio.AioRpcError | None = None
    failure: str = ""


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
                engine=self._engine_id, tenant=tenant_id, code="OK"
            )
        return child


class Dispatcher:
    """Routes each reply within its model's pool (`pools`, one policy each); without pools, over every engine
    with `policy`."""

    def __init__(
        self,
        pool: EnginePool,
        policy: RoutingPolicy,
        sessions: SessionTable,
        settings: DispatchSettings,
        pools: ModelPools | None = None,
    ):
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

    def _choose(
        self, model: str, key: DialogueKey, sticky: EngineId | None, exclude: set[EngineId]
    ) -> RouteDecision | None:
        if self.pools is None:
            return self.policy.choose(key, self.pool.snapshot(), sticky, frozenset(exclude))
        return self.pools.policy(model).choose(key, self.pools.snapshot(model), sticky, frozenset(exclude))

    def _route(self, model: str, key: DialogueKey, sticky: EngineId | None, exclude: set[EngineId]) -> RouteDecision:
        decision = self._choose(model, key, sticky, exclude)
        if decision is None:
            metrics.REFUSALS.labels(reason="no_engine").inc()
            raise Unavailable(
                f"no engine of {model} is serving; retry shortly"
                if self.pools is not None
                else "no engine is serving; retry shortly"
            )
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
        reply_request_id: the id GenerateFinal reports (the caller's own; default the engine request's).

        The failover policy: one attempt per engine (`_attempt`); after each, the way it ended decides
        what follows (a refusal spills to another engine, an engine error goes to the client, a failure
        moves the reply on with resume tokens) until an attempt finishes or the policy gives up."""
        key = dialogue_key(tenant_id, request.conversation_id)
        decision = await self._place(model, key)
        reply = _Reply(
            request,
            tenant_id,
            model,
            key,
            deadline_s,
            arrived_s,
            reply_request_id or request.request_id,
            decision.engine_id,
        )
        while True:
            handle = self.pool.by_id(reply.engine_id)
            if handle is None:  # removed between routing and now
                reply.exclude.add(reply.engine_id)
                reply.engine_id = self._route(model, key, None, reply.exclude).engine_id
                continue
            end = _AttemptEnd()
            # aclosing: whatever stops this generator closes the attempt too, which releases its call.
            async with contextlib.aclosing(self._attempt(handle, reply, end)) as events:
                async for event in events:
                    yield event
            if end.finished:
                return
            if end.rejected is not None:
                if not self._spill_refusal(reply, end.rejected):
                    raise self._upstream_error(reply, end.rejected)
                continue
            last = await self._fail_over(handle, reply, end.failure)
            if last is not None:
                yield last
                return

    async def _attempt(
        self, handle: EngineHandle, reply: _Reply, end: _AttemptEnd
    ) -> AsyncIterator[chat_pb2.GenerateResponse]:
        """Stream the reply from one engine, resuming after the tokens already forwarded, and record in
        `end` how the call ended. The call is released (cancelled, its trace ended, its in-flight count
        dropped) before this generator stops, whatever stops it."""
        # The request is ours (built by the servicer): each attempt resumes after what was sent.
        request = reply.request
        if reply.forwarded_token_ids:
            request.resume_token_ids[:] = reply.forwarded_token_ids
        timeout_s = None if reply.deadline_s is None else max(0.001, reply.deadline_s - time.monotonic())
        if reply.num_failovers == 0 and reply.num_refusals == 0:
            metrics.ADDED_LATENCY.labels(reply.model).observe(time.perf_counter() - reply.arrived_s)
        handle.num_inflight += 1
        engine_metrics = self._engine_metrics(reply.engine_id)
        engine_metrics.inflight.inc()
        call_trace = CallTrace(_ENGINE_GENERATE_METHOD)
        call_code, call_details = grpc.StatusCode.CANCELLED, None  # until the call says otherwise
        call = handle.generate(request, timeout=timeout_s, metadata=call_trace.metadata)
        try:
            event = await first_event(call, handle, self.settings.stall)
            while event is not grpc.aio.EOF:
                if end.finished:
                    pass  # nothing follows a final event: read the stream to its end
                elif event.HasField("final"):
                    call_code = grpc.StatusCode.OK  # the reply is whole, whatever follows it
                    self._finish(event.final, reply)
                    engine_metrics.ok(reply.tenant_id).inc()
                    # Let the call complete normally (its trace span ends with the stream).
                    end.finished = True
                    yield event
                else:
                    reply.forwarded_token_ids.extend(event.delta.token_ids)
                    if not reply.first_token_seen and event.delta.token_ids:
                        reply.first_token_seen = True
                        metrics.TIME_TO_FIRST_TOKEN.labels(reply.model).observe(time.perf_counter() - reply.arrived_s)
                    yield event
                event = await next_event(call, self.settings.stall)
            call_code = grpc.StatusCode.OK
            if not end.finished:
                end.failure = "stream ended without a final event"
        except EngineStalled as exc:
            if not end.finished:  # a silence after the final event costs the reply nothing
                metrics.STREAM_STALLS.labels(engine=reply.engine_id, kind=exc.kind).inc()
                end.failure = str(exc)
        except grpc.aio.AioRpcError as exc:
            call_code, call_details = exc.code(), exc.details()
            if call_code in _FAILOVER_CODES:
                end.failure = f"{call_code.name}: {exc.details()}"
            else:
                end.rejected = exc
        finally:
            call.cancel()
            call_trace.end(call_code, call_details)
            handle.num_inflight -= 1
            engine_metrics.inflight.dec()

    def _spill_refusal(self, reply: _Reply, error: grpc.aio.AioRpcError) -> bool:
        """An engine that refuses a new reply (RESOURCE_EXHAUSTED before any token) passes it to another
        engine, up to max_refusal_retries times: True with reply.engine_id moved on; False when the
        refusal goes to the client. The refused engine is excluded, so its released call does not
        weigh on the choice."""
        if (
            error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED
            or reply.forwarded_token_ids
            or reply.num_refusals >= self.settings.max_refusal_retries
        ):
            return False
        reply.num_refusals += 1
        reply.exclude.add(reply.engine_id)
        next_engine = self._choose(reply.model, reply.key, None, reply.exclude)
        if next_engine is None:
            return False
        metrics.SPILLS.inc()
        reply.engine_id = next_engine.engine_id
        return True

    @staticmethod
    def _upstream_error(reply: _Reply, error: grpc.aio.AioRpcError) -> UpstreamError:
        """The engine's own error status for the client, counted against the engine that gave it."""
        code = error.code()
        metrics.REQUESTS.labels(engine=reply.engine_id, tenant=reply.tenant_id, code=code.name).inc()
        retry_after = dict(error.trailing_metadata() or ()).get(RETRY_AFTER_METADATA_KEY)
        return UpstreamError(code, error.details() or code.name, retry_after)

    async def _fail_over(self, handle: EngineHandle, reply: _Reply, reason: str) -> chat_pb2.GenerateResponse | None:
        """The engine failed mid-stream (or before streaming): take it out of routing and move the reply
        to the next engine, which resumes after the tokens forwarded so far. Past max_failovers the
        client gets UNAVAILABLE. Returns the reply's last event when the failed engine had sent every
        token and only its final event was lost; None when the reply goes on elsewhere."""
        handle.mark_failed(reason)
        metrics.FAILOVERS.labels(from_engine=reply.engine_id).inc()
        if reply.num_failovers >= self.settings.max_failovers:
            metrics.REQUESTS.labels(engine=reply.engine_id, tenant=reply.tenant_id, code="UNAVAILABLE").inc()
            raise Unavailable(f"engine {reply.engine_id} failed ({reason}) and failover limit reached")
        reply.num_failovers += 1
        max_new_tokens = reply.request.sampling.max_new_tokens
        if max_new_tokens and len(reply.forwarded_token_ids) >= max_new_tokens:
            # Every token was sent; only the final event was lost. Nothing is left to resume.
            final = chat_pb2.GenerateFinal(finish_reason=chat_pb2.FINISH_REASON_LENGTH, engine_id=reply.engine_id)
            self._finish(final, reply)
            metrics.REQUESTS.labels(engine=reply.engine_id, tenant=reply.tenant_id, code="OK").inc()
            return chat_pb2.GenerateResponse(final=final)
        failed_engine = reply.engine_id
        reply.exclude.add(failed_engine)
        reply.engine_id = self._route(reply.model, reply.key, None, reply.exclude).engine_id
        await self._record(reply.key, reply.engine_id)
        log.warning(
            "failover",
            from_engine=failed_engine,
            to_engine=reply.engine_id,
            reason=reason,
            num_resume_tokens=len(reply.forwarded_token_ids),
        )
        return None

    @staticmethod
    def _finish(final: chat_pb2.GenerateFinal, reply: _Reply) -> None:
        """Make the final event describe the whole reply, across failovers."""
        final.failovers = reply.num_failovers
        final.request_id = reply.reply_request_id
        if not final.engine_id:
            final.engine_id = reply.engine_id
        if reply.num_failovers:
            # The engines count resumed tokens as generated; the gateway's count is the reply as sent.
            final.usage.generated_tokens = len(reply.forwarded_token_ids)
