"""Bad input over every public field of salon.chat.v1.GenerateRequest, through a real gateway + engine.

A plain reference (`expect`) says, for each generated request, which fields are wrong (by the rules the
proto documents) and whether the prompt fits the context. Precedence: what the gateway checks (ids of
the call, a context present and non-empty), then the count bound (a prompt whose number of ids or
messages alone cannot fit is OUT_OF_RANGE before other fields are looked at: cost bounded before
work), then every other field, then the rendered prompt's length. The stack must answer exactly that code,
with a message starting with one of the offending fields' names, or stream a reply within the budget.
Afterwards both processes live and the engine's KV accounting shows nothing leaked.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import grpc
import pytest
from hardening_stack import (
    KEY_A,
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
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from salon.api.chat.v1 import chat_pb2

VOCAB_SIZE = 262_144  # the Gemma vocabulary synthetic-tiny uses
CONTEXT_TOKENS = 512  # --max-context-tokens: small, so "beyond the context" is cheap to reach
DEFAULT_MAX_NEW_TOKENS = 4
MAX_NEW_TOKENS_LIMIT = 8192
# Byte-fallback tokens <0x80>..<0xFF>: alone they decode to invalid UTF-8.
BYTE_TOKEN_IDS = range(366, 494)
# Each of these renders to at least one token per repetition: far past CONTEXT_TOKENS.
LONG_TEXT = " harbour" * 700


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-input")
    engine = gateway = None
    try:
        engine = start_engine(
            "e0",
            tmp,
            extra=[
                "--max-context-tokens",
                str(CONTEXT_TOKENS),
                "--default-max-new-tokens",
                str(DEFAULT_MAX_NEW_TOKENS),
            ],
        )
        gateway = start_gateway({"e0": engine}, write_tenants(tmp / "tenants.json"), tmp)
        wait_gateway_sees(gateway, 1)
        yield engine, gateway
    finally:
        stop_all([gateway, engine])


# ---- the reference: what the answer must be -----------------------------------------------------


@dataclass(frozen=True)
class Expected:
    bad_fields: tuple[str, ...]  # INVALID_ARGUMENT naming one of these
    prompt_too_long: bool  # else OUT_OF_RANGE "prompt"
    budget: int | None  # tokens the reply may have; None when max_new_tokens does not fit
    edge_bad_fields: tuple[str, ...] = ()  # bad fields the gateway checks (before the count bound)
    too_many_to_fit: bool = False  # the count bound refuses it (OUT_OF_RANGE "prompt") before the fields


def _ids_bad(ids) -> bool:
    return any(t >= VOCAB_SIZE for t in ids)


def expect(request: chat_pb2.GenerateRequest) -> Expected:
    bad: list[str] = []
    conv_bytes = len(request.conversation_id.encode())
    if not 1 <= conv_bytes <= 256:
        bad.append("conversation_id")
    if len(request.request_id.encode()) > 128 or not request.request_id.isprintable():
        bad.append("request_id")
    which = request.WhichOneof("context")
    prompt_tokens_min, prompt_tokens_max = 0, 0
    if which is None:
        bad.append("context")
    elif which == "tokens":
        ids = request.tokens.token_ids
        if not ids:
            bad.append("tokens.token_ids")
        if _ids_bad(ids):
            bad.append("tokens.token_ids")
        prompt_tokens_min = prompt_tokens_max = len(ids)
    else:
        messages = request.dialogue.messages
        if not messages:
            bad.append("dialogue.messages")
        for i, m in enumerate(messages):
            if m.role not in (chat_pb2.ROLE_USER, chat_pb2.ROLE_CHARACTER, chat_pb2.ROLE_SYSTEM):
                bad.append(f"dialogue.messages[{i}].role")
            if bool(m.text) == bool(m.token_ids):
                bad.append(f"dialogue.messages[{i}]")
            if _ids_bad(m.token_ids):
                bad.append(f"dialogue.messages[{i}].token_ids")
        long_text = any(LONG_TEXT in m.text for m in messages) or LONG_TEXT in request.character.definition
        # Short dialogues below (<= 4 messages of <= 24 ids or short text) render far below the context.
        prompt_tokens_min, prompt_tokens_max = (CONTEXT_TOKENS, CONTEXT_TOKENS) if long_text else (1, 400)
    s = request.sampling
    if not (math.isfinite(s.temperature) and 0 <= s.temperature <= 100):
        bad.append("sampling.temperature")
    if not (math.isfinite(s.top_p) and 0 <= s.top_p <= 1):
        bad.append("sampling.top_p")
    if s.max_new_tokens > MAX_NEW_TOKENS_LIMIT:
        bad.append("sampling.max_new_tokens")
    if len(s.stop_strings) > 16 or any(not 1 <= len(x) <= 256 for x in s.stop_strings):
        bad.append("sampling.stop_strings")
    if len(s.stop_token_ids) > 64 or _ids_bad(s.stop_token_ids):
        bad.append("sampling.stop_token_ids")
    too_long = prompt_tokens_min >= CONTEXT_TOKENS
    room_min = CONTEXT_TOKENS - prompt_tokens_max
    edge = [f for f in bad if f in ("conversation_id", "request_id", "context", "dialogue.messages")]
    if which == "tokens" and not request.tokens.token_ids:
        edge.append("tokens.token_ids")
    if which == "tokens":
        count_bound = len(request.tokens.token_ids)
    elif which == "dialogue":
        count_bound = sum(max(1, len(m.token_ids)) for m in request.dialogue.messages)
    else:
        count_bound = 0
    if s.max_new_tokens == 0:
        budget = DEFAULT_MAX_NEW_TOKENS
    elif s.max_new_tokens <= room_min:
        budget = s.max_new_tokens
    else:
        budget = None
    return Expected(tuple(bad), too_long, budget, tuple(edge), count_bound >= CONTEXT_TOKENS)


# ---- strategies over every field ------------------------------------------------------------------


def mostly(valid, *bad, odds: int = 12):
    """`valid` `odds` times out of `odds + len(bad)`, else one of the bad strategies: most requests
    then carry zero or one bad field, so both the refusals and the served replies get exercised."""
    return st.integers(0, odds + len(bad) - 1).flatmap(lambda i: valid if i < odds else bad[i - odds])


valid_ids = st.integers(0, VOCAB_SIZE - 1)
any_ids = mostly(st.one_of(valid_ids, st.sampled_from(BYTE_TOKEN_IDS)), st.integers(VOCAB_SIZE, 2**32 - 1), odds=30)
short_text = st.text(max_size=12)
floats32 = mostly(
    st.one_of(st.floats(0, 1, width=32), st.sampled_from([0.0, 1.0])),
    st.sampled_from([100.5, -0.5, -1e-30, 1e30, math.inf, -math.inf, math.nan]),
    odds=6,
)
temperatures = mostly(
    st.one_of(st.floats(0, 2, width=32), st.just(100.0)),
    st.sampled_from([100.5, -0.5, -1e-30, 1e30, math.inf, -math.inf, math.nan]),
    odds=6,
)


@st.composite
def messages(draw):
    role = draw(
        mostly(
            st.sampled_from([chat_pb2.ROLE_USER, chat_pb2.ROLE_CHARACTER, chat_pb2.ROLE_SYSTEM]),
            st.just(chat_pb2.ROLE_UNSPECIFIED),
            st.just(7),
            odds=20,
        )
    )
    shape = draw(
        mostly(st.sampled_from(["text", "ids"]), st.just("both"), st.just("neither"), st.just("long"), odds=20)
    )
    m = chat_pb2.Message(role=role, author=draw(short_text))
    if shape in ("text", "both"):
        m.text = draw(st.text(min_size=1, max_size=40))
    if shape == "long":
        m.text = LONG_TEXT
    if shape in ("ids", "both"):
        m.token_ids.extend(draw(st.lists(any_ids, min_size=1, max_size=24)))
    return m


@st.composite
def generate_requests(draw):
    r = chat_pb2.GenerateRequest(
        conversation_id=draw(
            mostly(st.text(min_size=1, max_size=16), st.just(""), st.just("x" * 257), st.just("é" * 129))
        ),
        request_id=draw(mostly(st.one_of(st.just(""), st.text(max_size=16)), st.just("r" * 129), st.just("bad\nid"))),
    )
    if draw(st.booleans()):
        r.character.name = draw(short_text)
        r.character.definition = draw(mostly(short_text, st.just(LONG_TEXT)))
    context = draw(
        mostly(
            st.sampled_from(["tokens", "dialogue"]),
            st.just("none"),
            st.just("tokens_long"),
            st.just("dialogue_empty"),
            st.just("tokens_empty"),
            odds=16,
        )
    )
    if context == "tokens":
        r.tokens.token_ids.extend(draw(st.lists(any_ids, min_size=1, max_size=24)))
    elif context == "tokens_empty":
        r.tokens.SetInParent()
    elif context == "tokens_long":
        r.tokens.token_ids.extend([2] + [1124] * (CONTEXT_TOKENS + draw(st.integers(-1, 40))))
    elif context == "dialogue":
        r.dialogue.messages.extend(draw(st.lists(messages(), min_size=1, max_size=4)))
    elif context == "dialogue_empty":
        r.dialogue.SetInParent()
    if draw(st.booleans()):
        s = r.sampling
        s.max_new_tokens = draw(
            mostly(
                st.integers(0, 6), st.integers(400, 600), st.sampled_from([MAX_NEW_TOKENS_LIMIT + 1, 2**32 - 1]), odds=8
            )
        )
        s.temperature = draw(temperatures)
        s.top_k = draw(st.one_of(st.just(0), st.integers(1, 2**32 - 1)))
        s.top_p = draw(floats32)
        if draw(st.booleans()):
            s.seed = draw(st.integers(0, 2**64 - 1))
        s.stop_strings.extend(
            draw(
                mostly(
                    st.lists(st.text(min_size=1, max_size=4), max_size=3),
                    st.just(["z"] * 17),
                    st.just(["y" * 257]),
                    st.just([""]),
                )
            )
        )
        s.stop_token_ids.extend(draw(mostly(st.lists(any_ids, max_size=3), st.just([5] * 65))))
        s.return_logprobs = draw(st.booleans())
    return r


def _check(stub, request: chat_pb2.GenerateRequest) -> None:
    want = expect(request)
    try:
        reply = collect(stub.Generate(request, metadata=auth(KEY_A), timeout=30))
        error = None
    except grpc.RpcError as exc:
        error = exc
    event("refused: " + error.code().name if error is not None else "served")
    if want.edge_bad_fields:
        assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert error.details().startswith(want.edge_bad_fields), (error.details(), want.edge_bad_fields)
    elif want.too_many_to_fit:
        assert error is not None and error.code() == grpc.StatusCode.OUT_OF_RANGE, error
        assert error.details().startswith("prompt"), error.details()
    elif want.bad_fields:
        assert error is not None, f"accepted a request with bad {want.bad_fields}"
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
        assert error.details().startswith(want.bad_fields), (error.details(), want.bad_fields)
    elif want.prompt_too_long:
        assert error is not None and error.code() == grpc.StatusCode.OUT_OF_RANGE, error
        assert error.details().startswith("prompt"), error.details()
    elif want.budget is None:
        assert error is not None and error.code() == grpc.StatusCode.OUT_OF_RANGE, error
        assert error.details().startswith("sampling.max_new_tokens"), error.details()
    else:
        assert error is None, (error.code(), error.details())
        assert reply.final is not None
        assert reply.final.finish_reason != chat_pb2.FINISH_REASON_UNSPECIFIED
        assert reply.final.usage.generated_tokens == len(reply.token_ids) <= want.budget


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=generate_requests())
def test_every_field_gets_the_documented_answer(stack, request) -> None:
    _, gateway = stack
    channel, stub = chat_stub(gateway.address)
    with channel:
        _check(stub, request)


def test_no_crash_and_no_leak_after_the_examples(stack) -> None:
    engine, gateway = stack
    assert gateway.process.poll() is None
    assert_engine_clean(engine)


def test_byte_fallback_ids_that_are_not_utf8_still_stream_valid_text(stack) -> None:
    """Pre-tokenized prompts and messages of lone continuation bytes are valid ids: served, and every
    text delta the client gets is whole UTF-8 (grpc would fail to encode anything else)."""
    _, gateway = stack
    channel, stub = chat_stub(gateway.address)
    with channel:
        reply = collect(
            stub.Generate(chat_request("bytes", 6, prompt=[2, 493, 366, 433, 464]), metadata=auth(KEY_A), timeout=30)
        )
        assert reply.final.usage.prompt_tokens == 5
        request = chat_pb2.GenerateRequest(
            conversation_id="bytes-dialogue",
            dialogue=chat_pb2.Dialogue(
                messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, token_ids=[493, 366, 366, 433])]
            ),
            sampling=chat_pb2.SamplingParams(max_new_tokens=4),
        )
        reply = collect(stub.Generate(request, metadata=auth(KEY_A), timeout=30))
        assert reply.final is not None
        reply.text.encode("utf-8")


def test_invalid_utf8_in_a_string_field_is_invalid_argument(stack) -> None:
    """proto3 strings must be UTF-8: bytes that are not parse-fail; the client gets INVALID_ARGUMENT
    (grpc alone would answer UNKNOWN with the parser's exception)."""
    engine, gateway = stack
    marker = b"QQQQ"
    template = chat_pb2.GenerateRequest(
        conversation_id="utf8",
        dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, text=marker.decode())]),
    )
    for field in ("text", "conversation_id"):
        raw = template.SerializeToString()
        raw = raw.replace(marker, b"\xff\xfe\x80Q") if field == "text" else raw.replace(b"utf8", b"ut\xc3\x28")
        with grpc.insecure_channel(gateway.address) as channel:
            call = channel.unary_stream(
                "/salon.chat.v1.ChatService/Generate",
                request_serializer=lambda b: b,
                response_deserializer=chat_pb2.GenerateResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as info:
                list(call(raw, metadata=auth(KEY_A), timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        assert info.value.details().startswith("request: ") and "UTF-8" in info.value.details()
    assert_engine_clean(engine)


def test_oversized_message_is_resource_exhausted_fast(stack) -> None:
    engine, gateway = stack
    request = chat_request("huge", 2)
    request.sampling.stop_strings.append("s" * (65 << 20))
    channel, stub = chat_stub(gateway.address, options=[("grpc.max_send_message_length", 256 << 20)])
    with channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(request, metadata=auth(KEY_A), timeout=30))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in info.value.details()
        assert time.monotonic() - started < 10
        # Still serving.
        assert collect(stub.Generate(chat_request("after-huge", 2), metadata=auth(KEY_A), timeout=30)).final
    assert_engine_clean(engine)


def test_huge_message_below_the_grpc_limit_is_out_of_range(stack) -> None:
    """A 2 MB message (fits gRPC's limit, not the context) is refused as OUT_OF_RANGE naming the prompt."""
    engine, gateway = stack
    request = chat_pb2.GenerateRequest(
        conversation_id="big-text",
        dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, text="sail " * 400_000)]),
    )
    channel, stub = chat_stub(gateway.address)
    with channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(request, metadata=auth(KEY_A), timeout=60))
        elapsed_s = time.monotonic() - started
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE, info.value
    assert info.value.details().startswith("prompt")
    print(f"2 MB message refused in {elapsed_s * 1000:.0f} ms")
    assert_engine_clean(engine)


@pytest.mark.parametrize(
    "num_prompt_tokens, max_new_tokens, field",
    [
        (CONTEXT_TOKENS, 1, "prompt"),
        (CONTEXT_TOKENS + 300, 0, "prompt"),
        (CONTEXT_TOKENS - 10, 11, "sampling.max_new_tokens"),
        (CONTEXT_TOKENS - 10, 10, None),
    ],
)
def test_context_edges_are_exact(stack, num_prompt_tokens, max_new_tokens, field) -> None:
    engine, gateway = stack
    request = chat_request("edges", max_new_tokens, prompt=[2] + [1124] * (num_prompt_tokens - 1))
    channel, stub = chat_stub(gateway.address)
    with channel:
        if field is None:
            reply = collect(stub.Generate(request, metadata=auth(KEY_A), timeout=30))
            assert reply.final.usage.prompt_tokens == num_prompt_tokens
            assert len(reply.token_ids) <= max_new_tokens
        else:
            with pytest.raises(grpc.RpcError) as info:
                collect(stub.Generate(request, metadata=auth(KEY_A), timeout=30))
            assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
            assert info.value.details().startswith(field)


def test_dialogue_history_beyond_the_context_is_out_of_range(stack) -> None:
    _, gateway = stack
    history = [
        chat_pb2.Message(
            role=chat_pb2.ROLE_USER if i % 2 == 0 else chat_pb2.ROLE_CHARACTER,
            text=f"message {i} about the tides and the wind",
        )
        for i in range(120)
    ]
    request = chat_pb2.GenerateRequest(conversation_id="long-history", dialogue=chat_pb2.Dialogue(messages=history))
    channel, stub = chat_stub(gateway.address)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(request, metadata=auth(KEY_A), timeout=30))
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert info.value.details().startswith("prompt")
