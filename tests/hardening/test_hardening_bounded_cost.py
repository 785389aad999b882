"""Cost is bounded before work: hostile requests (a huge message count, ids near the public message
cap, megabytes of text) are refused OUT_OF_RANGE from their counts alone, at the gateway and at the
engine, while another tenant's small request is served alongside. The figures against the targets
(<= 50 ms refusal, <= 20 ms added to a concurrent request) are measured by `python -m bench.hostile`;
here a generous bound only guards against refusals that scale with the request again (5.2 s before)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from hardening_stack import (
    KEY_A,
    KEY_B,
    assert_engine_clean,
    auth,
    chat_request,
    chat_stub,
    collect,
    start_engine,
    start_gateway,
    stop_all,
    wait_gateway_sees,
    write_tenants,
)

from bench.hostile import KINDS, hostile_request
from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc

GUARD_S = 1.0  # far above the bench's figures, far below what work proportional to the request costs


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bounded")
    engine = gateway = None
    try:
        engine = start_engine("e0", tmp)
        gateway = start_gateway({"e0": engine}, write_tenants(tmp / "tenants.json"), tmp)
        wait_gateway_sees(gateway, 1)
        channel, stub = chat_stub(gateway.address)
        with channel:  # the gateway learns the engines' context (GetModelInfo) for its count bound
            stub.GetModelInfo(chat_pb2.GetModelInfoRequest(), metadata=auth(KEY_A), timeout=30)
        yield engine, gateway
    finally:
        stop_all([gateway, engine])


def _refuse(call, payload: bytes) -> tuple[grpc.RpcError, float]:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        list(call(payload))
    return info.value, time.monotonic() - started


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_requests_are_refused_from_their_counts(stack, kind) -> None:
    engine, gateway = stack
    payload = hostile_request(kind).SerializeToString()
    assert 2_000_000 < len(payload) < 4 << 20  # under the public cap: grpc itself lets it through
    options = [("grpc.max_send_message_length", 8 << 20)]
    with grpc.insecure_channel(gateway.address, options=options) as channel:
        method = channel.unary_stream(
            "/salon.chat.v1.ChatService/Generate",
            request_serializer=lambda b: b,
            response_deserializer=chat_pb2.GenerateResponse.FromString,
        )
        error, elapsed_s = _refuse(lambda p: method(p, metadata=auth(KEY_A), timeout=30), payload)
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE and error.details().startswith("prompt"), error
    print(f"{kind}: refused by the gateway in {elapsed_s * 1000:.0f} ms")
    assert elapsed_s < GUARD_S
    # Straight to the engine (it bounds cost on its own too).
    engine_request = engine_pb2.GenerateRequest(request_id=f"hostile-{kind}", conversation_id="hostile")
    parsed = hostile_request(kind)
    if parsed.WhichOneof("context") == "dialogue":
        engine_request.dialogue.CopyFrom(parsed.dialogue)
    else:
        engine_request.tokens.CopyFrom(parsed.tokens)
    with grpc.insecure_channel(engine.address, options=options) as channel:
        stub = engine_pb2_grpc.EngineServiceStub(channel)
        error, elapsed_s = _refuse(lambda r: stub.Generate(r, timeout=30), engine_request)
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE and error.details().startswith("prompt"), error
    print(f"{kind}: refused by the engine in {elapsed_s * 1000:.0f} ms")
    assert elapsed_s < GUARD_S
    assert_engine_clean(engine)


def test_over_the_public_cap_is_resource_exhausted_before_parsing(stack) -> None:
    _, gateway = stack
    request = chat_pb2.GenerateRequest(
        conversation_id="too-big", tokens=chat_pb2.TokenizedPrompt(token_ids=[262_000] * 1_500_000)
    )  # 4.5 MB
    channel, stub = chat_stub(gateway.address, options=[("grpc.max_send_message_length", 8 << 20)])
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(request, metadata=auth(KEY_A), timeout=30))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_count_bound_comes_before_the_other_fields(stack) -> None:
    """A prompt that cannot fit is refused as such even when some other field is also wrong: its
    fields are never looked at one by one."""
    _, gateway = stack
    hostile = hostile_request("messages")
    hostile.dialogue.messages[7].role = 9  # not a role: would be INVALID_ARGUMENT if it were read
    hostile.sampling.temperature = -1.0
    channel, stub = chat_stub(gateway.address, options=[("grpc.max_send_message_length", 8 << 20)])
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(hostile, metadata=auth(KEY_A), timeout=30))
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        small = chat_request("fits", 2)
        small.sampling.temperature = -1.0
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(small, metadata=auth(KEY_A), timeout=30))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith("sampling.temperature")


def test_another_tenants_small_request_is_served_alongside(stack) -> None:
    engine, gateway = stack
    payload = hostile_request("messages").SerializeToString()
    stop = threading.Event()
    refused = []

    def attack() -> None:
        with grpc.insecure_channel(gateway.address, options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
            method = ch.unary_stream(
                "/salon.chat.v1.ChatService/Generate",
                request_serializer=lambda b: b,
                response_deserializer=chat_pb2.GenerateResponse.FromString,
            )
            while not stop.is_set():
                try:
                    list(method(payload, metadata=auth(KEY_A), timeout=30))
                except grpc.RpcError as exc:
                    refused.append(exc.code())

    attacker = threading.Thread(target=attack)
    attacker.start()
    try:
        channel, stub = chat_stub(gateway.address)
        with channel:
            for i in range(5):
                reply = collect(stub.Generate(chat_request(f"small-{i}", 4), metadata=auth(KEY_B), timeout=30))
                assert reply.final is not None and reply.final.usage.generated_tokens == len(reply.token_ids)
    finally:
        stop.set()
        attacker.join(30)
    assert refused and set(refused) == {grpc.StatusCode.OUT_OF_RANGE}
    assert_engine_clean(engine)
