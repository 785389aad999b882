"""The stall bounds and staleness rules with scripted in-process engines (real gRPC on loopback), where
the test decides what an engine reports and when it speaks: a reply queued behind others waits past the
first-token bound while its engine reports a queue, and fails over without one; an engine silent
mid-stream fails over with the tokens already sent; an engine whose load reports stop leaves the ring
and rejoins with its next report. (tests/gateway/test_gateway_stall.py does the same with real engines.)"""

from __future__ import annotations

import asyncio
import time

import pytest
from test_gateway_dispatch import conv_owned_by, run, teardown
from test_gateway_membership import ScriptedEngine, start_engine

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2
from salon.gateway import metrics
from salon.gateway.bootstrap import GatewayService
from salon.gateway.config import GatewayConfig
from salon.gateway.dispatch import Dispatcher, DispatchSettings
from salon.gateway.membership import EngineEndpoint, EnginePool, PoolSettings
from salon.gateway.ring import HashRing
from salon.gateway.routing import BoundedLoadPolicy
from salon.gateway.sessions import InMemorySessionTable
from salon.gateway.stall_watch import StallTimeouts
from salon.gateway.types import EngineId, TenantId, dialogue_key

FIRST_TOKEN_TIMEOUT_S = 0.8
INTER_TOKEN_TIMEOUT_S = 0.5
STALE_AFTER_S = 0.4


class Scripted:
    """Generate: wait `first_delay_s`, stream tokens resume+1.., go silent for `hang_s` after `hang_after`."""

    def __init__(self, engine_id: str, first_delay_s: float = 0.0, hang_after: int | None = None):
        self.engine_id, self.first_delay_s, self.hang_after = engine_id, first_delay_s, hang_after
        self.requests: list[engine_pb2.GenerateRequest] = []

    async def Generate(self, request, context):
        self.requests.append(request)
        await asyncio.sleep(self.first_delay_s)
        resumed = len(request.resume_token_ids)
        for i, token in enumerate(range(resumed + 1, request.sampling.max_new_tokens + 1)):
            if i == self.hang_after:
                await asyncio.sleep(3600)
            yield engine_pb2.GenerateResponse(delta=chat_pb2.TokenDelta(token_ids=[token], text=f"<{token}>"))
        yield engine_pb2.GenerateResponse(
            final=chat_pb2.GenerateFinal(engine_id=self.engine_id, finish_reason=chat_pb2.FINISH_REASON_LENGTH)
        )


class PausableEngine(ScriptedEngine):
    """WatchLoad reports only while `reporting` is set (a hung engine sends nothing)."""

    def __init__(self, engine_id: str):
        super().__init__(engine_id)
        self.reporting = asyncio.Event()
        self.reporting.set()

    async def WatchLoad(self, request, context):
        while True:
            await self.reporting.wait()
            yield engine_pb2.WatchLoadResponse(load=self.report)
            await asyncio.sleep(request.interval_ms / 1000)


async def make_stack(behaviours: dict[str, Scripted], stale_after_s: float = 0.0):
    servers, endpoints, scripted = [], [], {}
    for engine_id, behaviour in behaviours.items():
        server, engine, _, port = await start_engine(engine_id)
        engine.generate = behaviour.Generate
        engine.set_report(model_id="m")
        servers.append(server)
        scripted[engine_id] = engine
        endpoints.append(EngineEndpoint(f"127.0.0.1:{port}", EngineId(engine_id)))
    pool = EnginePool(endpoints, PoolSettings(load_interval_ms=50, stale_after_s=stale_after_s))
    pool.start()
    await pool.wait_for(lambda s: sum(x.accepting for x in s.values()) == len(behaviours), timeout_s=5)
    settings = DispatchSettings(stall=StallTimeouts(FIRST_TOKEN_TIMEOUT_S, INTER_TOKEN_TIMEOUT_S))
    dispatcher = Dispatcher(pool, BoundedLoadPolicy(), InMemorySessionTable(ttl_s=60), settings)
    return (servers, pool, dispatcher), scripted


def _stalls(engine_id: str, kind: str) -> float:
    return metrics.STREAM_STALLS.labels(engine=engine_id, kind=kind)._value.get()


def _another_owned_by(engine_id: str) -> str:
    ring = HashRing(["a", "b"])
    return next(
        c for c in (f"other-{i}" for i in range(1000)) if ring.owner(dialogue_key(TenantId("t"), c)) == engine_id
    )


def _tokens(events) -> list[int]:
    return [t for e in events[:-1] for t in e.delta.token_ids]


async def test_a_reply_queued_behind_others_waits_past_the_first_token_bound() -> None:
    delay_s = 3 * FIRST_TOKEN_TIMEOUT_S
    behaviours = {"a": Scripted("a", first_delay_s=delay_s), "b": Scripted("b")}
    stack, scripted = await make_stack(behaviours)
    try:
        scripted["a"].set_report(waiting_requests=1)  # the engine is alive and its queue is not empty
        before = _stalls("a", "first_token")
        started = time.monotonic()
        events = await run(stack[2], conv_owned_by("a", ["a", "b"]), max_new_tokens=4)
        assert time.monotonic() - started >= delay_s
        assert (events[-1].final.engine_id, events[-1].final.failovers) == ("a", 0)
        assert _tokens(events) == [1, 2, 3, 4]
        assert _stalls("a", "first_token") == before
    finally:
        await teardown(*stack)


async def test_without_a_queue_the_first_token_bound_fails_the_reply_over() -> None:
    behaviours = {"a": Scripted("a", first_delay_s=3600), "b": Scripted("b")}
    stack, _ = await make_stack(behaviours)
    try:
        before = _stalls("a", "first_token")
        started = time.monotonic()
        events = await run(stack[2], conv_owned_by("a", ["a", "b"]), max_new_tokens=4)
        assert time.monotonic() - started >= FIRST_TOKEN_TIMEOUT_S
        assert (events[-1].final.engine_id, events[-1].final.failovers) == ("b", 1)
        assert _tokens(events) == [1, 2, 3, 4]
        assert _stalls("a", "first_token") == before + 1
    finally:
        await teardown(*stack)


async def test_silence_mid_stream_fails_over_with_the_tokens_already_sent() -> None:
    behaviours = {"a": Scripted("a", hang_after=3), "b": Scripted("b")}
    stack, _ = await make_stack(behaviours)
    try:
        before = _stalls("a", "inter_token")
        events = await run(stack[2], conv_owned_by("a", ["a", "b"]), max_new_tokens=8)
        assert _tokens(events) == [1, 2, 3, 4, 5, 6, 7, 8]
        assert (events[-1].final.engine_id, events[-1].final.failovers) == ("b", 1)
        assert list(behaviours["b"].requests[0].resume_token_ids) == [1, 2, 3]
        assert _stalls("a", "inter_token") == before + 1
    finally:
        await teardown(*stack)


async def test_an_engine_whose_reports_stop_leaves_the_ring_until_it_reports_again(monkeypatch) -> None:
    monkeypatch.setattr("test_gateway_membership.ScriptedEngine", PausableEngine)  # start_engine makes these
    behaviours = {"a": Scripted("a"), "b": Scripted("b")}
    stack, scripted = await make_stack(behaviours, stale_after_s=STALE_AFTER_S)
    pool, dispatcher = stack[1], stack[2]
    try:
        conversation = conv_owned_by("a", ["a", "b"])
        assert (await run(dispatcher, conversation, 2))[-1].final.engine_id == "a"
        scripted["a"].reporting.clear()
        await pool.wait_for(lambda s: not s["a"].accepting, timeout_s=5 + STALE_AFTER_S)
        assert pool.by_id(EngineId("a")).silent.is_set()
        # Out of the ring: a new dialogue it owns goes to b at once, without a failover.
        events = await run(dispatcher, _another_owned_by("a"), 2)
        assert (events[-1].final.engine_id, events[-1].final.failovers) == ("b", 0)
        scripted["a"].reporting.set()
        await pool.wait_for(lambda s: s["a"].accepting, timeout_s=5)
        # Its dialogue comes back to it.
        assert (await run(dispatcher, conversation, 2))[-1].final.engine_id == "a"
    finally:
        scripted["a"].reporting.set()
        await teardown(*stack)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"engine_stale_after_s": 0.3, "load_interval_ms": 250}, "engine_stale_after_s"),
        ({"engine_stale_after_s": -1.0}, "engine_stale_after_s"),
        ({"first_token_timeout_s": -1.0}, "first_token_timeout_s"),
        ({"inter_token_timeout_s": -0.5}, "inter_token_timeout_s"),
    ],
)
def test_bounds_that_cannot_work_are_refused_at_start(flags, named) -> None:
    with pytest.raises(ValueError, match=rf"^{named}: "):
        GatewayService(GatewayConfig(engines="e0=127.0.0.1:1", **flags))
    GatewayService(GatewayConfig(engines="e0=127.0.0.1:1", **{k: 0 for k in flags if k != "load_interval_ms"}))
