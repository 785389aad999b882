"""Dispatcher error paths driven by scripted in-process engines (real gRPC on loopback): refusals
spill to the next engine, engine errors reach the client unchanged, a stream that ends without a
final event fails over with the tokens already sent as resume_token_ids."""

from __future__ import annotations

import time

import grpc
import pytest
from test_gateway_membership import start_engine

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.errors import RETRY_AFTER_METADATA_KEY
from salon.gateway.dispatch import Dispatcher, DispatchSettings, UpstreamError
from salon.gateway.membership import EngineEndpoint, EnginePool, PoolSettings
from salon.gateway.ring import HashRing
from salon.gateway.routing import BoundedLoadPolicy
from salon.gateway.sessions import InMemorySessionTable
from salon.gateway.types import EngineId, TenantId, dialogue_key


class Behaviour(engine_pb2_grpc.EngineServiceServicer):
    """Generate: either refuse with `code`, or stream tokens resume+1.. and maybe stop without a final."""

    def __init__(self, engine_id, code=None, cut_after: int | None = None):
        self.engine_id, self.code, self.cut_after = engine_id, code, cut_after
        self.requests: list[engine_pb2.GenerateRequest] = []

    async def Generate(self, request, context):
        self.requests.append(request)
        if self.code is not None:
            await context.abort(
                self.code, f"{self.engine_id} says no", trailing_metadata=((RETRY_AFTER_METADATA_KEY, "700"),)
            )
        resumed = list(request.resume_token_ids)
        tokens = range(len(resumed) + 1, request.sampling.max_new_tokens + 1)
        for i, token in enumerate(tokens):
            if self.cut_after is not None and i == self.cut_after:
                return
            yield engine_pb2.GenerateResponse(delta=chat_pb2.TokenDelta(token_ids=[token], text=f"<{token}>"))
        if self.cut_after is not None and self.cut_after >= len(tokens):
            return  # every token sent, the final never
        yield engine_pb2.GenerateResponse(
            final=chat_pb2.GenerateFinal(
                engine_id=self.engine_id,
                finish_reason=chat_pb2.FINISH_REASON_LENGTH,
                usage=chat_pb2.Usage(generated_tokens=request.sampling.max_new_tokens),
            )
        )


async def make_stack(behaviours: dict[str, Behaviour]):
    servers, endpoints = [], []
    for engine_id, behaviour in behaviours.items():
        server, scripted, _, port = await start_engine(engine_id)
        # The scripted engine answers WatchLoad; Generate comes from the behaviour.
        scripted.generate = behaviour.Generate
        servers.append(server)
        endpoints.append(EngineEndpoint(f"127.0.0.1:{port}", EngineId(engine_id)))
    pool = EnginePool(endpoints, PoolSettings(load_interval_ms=50))
    pool.start()
    await pool.wait_for(lambda s: len([1 for x in s.values() if x.accepting]) == len(behaviours), timeout_s=5)
    dispatcher = Dispatcher(pool, BoundedLoadPolicy(), InMemorySessionTable(ttl_s=60), DispatchSettings())
    return servers, pool, dispatcher


async def run(dispatcher, conv: str, max_new_tokens: int = 6):
    request = engine_pb2.GenerateRequest(
        request_id="r1",
        conversation_id=conv,
        tokens=chat_pb2.TokenizedPrompt(token_ids=[1]),
        sampling=chat_pb2.SamplingParams(max_new_tokens=max_new_tokens),
    )
    return [e async for e in dispatcher.stream(request, TenantId("t"), None, time.perf_counter())]


def conv_owned_by(owner: str, ids) -> str:
    ring = HashRing(ids)
    return next(f"c{i}" for i in range(1000) if ring.owner(dialogue_key(TenantId("t"), f"c{i}")) == owner)


async def teardown(servers, pool, dispatcher):
    await dispatcher.close()
    await pool.stop()
    for server in servers:
        await server.stop(None)


async def test_refusal_spills_to_next_engine() -> None:
    behaviours = {"a": Behaviour("a", code=grpc.StatusCode.RESOURCE_EXHAUSTED), "b": Behaviour("b")}
    stack = await make_stack(behaviours)
    try:
        events = await run(stack[2], conv_owned_by("a", ["a", "b"]))
        assert events[-1].final.engine_id == "b" and events[-1].final.failovers == 0
        assert [t for e in events[:-1] for t in e.delta.token_ids] == [1, 2, 3, 4, 5, 6]
        assert len(behaviours["a"].requests) == 1
    finally:
        await teardown(*stack)


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED])
async def test_engine_error_passes_through(code) -> None:
    behaviours = {"a": Behaviour("a", code=code), "b": Behaviour("b", code=code)}
    stack = await make_stack(behaviours)
    try:
        with pytest.raises(UpstreamError) as info:
            await run(stack[2], "x")
        assert info.value.code == code and "says no" in info.value.message
        assert info.value.trailing_metadata() == ((RETRY_AFTER_METADATA_KEY, "700"),)
    finally:
        await teardown(*stack)


async def test_stream_without_final_fails_over_with_resume_tokens() -> None:
    behaviours = {"a": Behaviour("a", cut_after=3), "b": Behaviour("b")}
    stack = await make_stack(behaviours)
    try:
        events = await run(stack[2], conv_owned_by("a", ["a", "b"]), max_new_tokens=8)
        assert [t for e in events[:-1] for t in e.delta.token_ids] == [1, 2, 3, 4, 5, 6, 7, 8]
        final = events[-1].final
        assert (final.engine_id, final.failovers, final.usage.generated_tokens, final.request_id) == ("b", 1, 8, "r1")
        assert list(behaviours["b"].requests[0].resume_token_ids) == [1, 2, 3]
        # The dialogue's session now points at the engine that finished it.
        assert await stack[2].sessions.get(dialogue_key(TenantId("t"), conv_owned_by("a", ["a", "b"]))) == "b"
    finally:
        await teardown(*stack)


async def test_failover_limit_gives_unavailable() -> None:
    behaviours = {"a": Behaviour("a", cut_after=1), "b": Behaviour("b", cut_after=1), "c": Behaviour("c", cut_after=1)}
    stack = await make_stack(behaviours)
    try:
        from salon.common.errors import Unavailable

        with pytest.raises(Unavailable, match="failover limit"):
            await run(stack[2], "x")
        assert sum(len(b.requests) for b in behaviours.values()) == 3  # first try + max_failovers=2
    finally:
        await teardown(*stack)


async def test_final_lost_after_last_token_is_synthesised() -> None:
    """The engine sent every token (max_new_tokens) and died before its final: no resume is needed."""
    behaviours = {"a": Behaviour("a", cut_after=4), "b": Behaviour("b")}
    stack = await make_stack(behaviours)
    try:
        events = await run(stack[2], conv_owned_by("a", ["a", "b"]), max_new_tokens=4)
        assert [t for e in events[:-1] for t in e.delta.token_ids] == [1, 2, 3, 4]
        final = events[-1].final
        assert (final.finish_reason, final.failovers, final.usage.generated_tokens, final.engine_id) == (
            chat_pb2.FINISH_REASON_LENGTH,
            1,
            4,
            "a",
        )
        assert behaviours["b"].requests == []
    finally:
        await teardown(*stack)
