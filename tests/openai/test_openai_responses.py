"""`/v1/responses` with the official `openai` package against real processes (two engines; a gateway
with the in-memory session table, one with a real redis-server): the Response object and the typed
event stream, the same reply as the chat endpoint, `previous_response_id` continuations (the same
conversation and engine, cached tokens), tenant isolation, erasure by DeleteConversation, expiry, and
the 400/404 answers that name the field."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
import openai
import pytest
import redis

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service
from tests.gateway.gateway_helpers import RedisServer
from tests.hardening.hardening_stack import (
    KEY_A,
    KEY_B,
    MODEL,
    auth,
    start_engine,
    start_gateway,
    stop_all,
    wait_gateway_sees,
    write_tenants,
)

REAL_MODEL = "smollm2-135m-instruct"  # a model that ends its turns (the synthetic one never does)
MAX_CONTEXT_TOKENS = 256  # small, so that a dialogue can fill it
SYSTEM = "You are Ada, a lighthouse keeper who answers in short sentences."
STREAM_TYPES_HEAD = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
STREAM_TYPES_TAIL = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.incomplete",  # the synthetic model never ends its turn: the budget ends it
]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("responses")
    procs = {}
    try:
        for engine_id in ("e0", "e1"):
            procs[engine_id] = start_engine(engine_id, tmp, ["--max-context-tokens", str(MAX_CONTEXT_TOKENS)])
        yield procs, tmp
    finally:
        stop_all(procs.values())


def _gateway(engines, name: str, extra: list[str] = ()):
    procs, tmp = engines
    gateway = start_gateway(
        procs, write_tenants(tmp / "tenants.json"), tmp, name=name, extra=["--http-port", "0", *extra]
    )
    try:
        wait_gateway_sees(gateway, len(procs))
    except BaseException:
        gateway.stop()
        raise
    return gateway


@pytest.fixture(scope="module")
def gateway(engines):
    proc = _gateway(engines, "gateway-memory")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def redis_store():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_gateway(engines, redis_store):
    proc = _gateway(engines, "gateway-redis", ["--redis-url", redis_store.url])
    yield proc
    proc.stop()


def client(gateway, key: str = KEY_A) -> openai.OpenAI:
    base_url = f"http://127.0.0.1:{gateway.extra_ports['http_port']}/v1"
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)


def create(c: openai.OpenAI, text: str, **kw):
    return c.responses.create(model=MODEL, input=text, instructions=SYSTEM, max_output_tokens=12, temperature=0, **kw)


def chat_reply(c: openai.OpenAI, messages: list[dict], system: str = SYSTEM) -> str:
    messages = [{"role": "system", "content": system}, *messages]
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    return r.choices[0].message.content


def delete_conversation(gateway, conversation_id: str, key: str = KEY_A) -> None:
    with grpc.insecure_channel(gateway.address) as channel:
        chat_pb2_grpc.ChatServiceStub(channel).DeleteConversation(
            chat_pb2.DeleteConversationRequest(conversation_id=conversation_id), metadata=auth(key), timeout=30
        )


def test_response_equals_the_chat_reply_to_the_same_messages(gateway):
    c = client(gateway)
    r = create(c, "Hello from the responses API! How is the sea?")
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.instructions == SYSTEM and r.max_output_tokens == 12 and r.temperature == 0 and r.store
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [p.type for p in message.content] == ["output_text"]
    assert r.output_text == message.content[0].text
    assert r.output_text == chat_reply(
        c, [{"role": "user", "content": "Hello from the responses API! How is the sea?"}]
    )
    assert r.usage.output_tokens == 12 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + 12
    # A list of messages with input_text parts is the same dialogue as the string.
    listed = c.responses.create(
        model=MODEL,
        instructions=SYSTEM,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Hello from the responses API! "},
                    {"type": "input_text", "text": "How is the sea?"},
                ],
            }
        ],
        max_output_tokens=12,
        temperature=0,
    )
    assert listed.output_text == r.output_text and listed.usage.input_tokens == r.usage.input_tokens


def test_streamed_events_in_order_carry_the_whole_response(gateway):
    c = client(gateway)
    whole = create(c, "Stream me the weather at the lighthouse.", store=False)
    events = list(create(c, "Stream me the weather at the lighthouse.", store=False, stream=True))
    types = [e.type for e in events]
    num_deltas = len(types) - len(STREAM_TYPES_HEAD) - len(STREAM_TYPES_TAIL)
    assert num_deltas >= 1
    assert types == STREAM_TYPES_HEAD + ["response.output_text.delta"] * num_deltas + STREAM_TYPES_TAIL
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    deltas = events[4 : 4 + num_deltas]
    assert all(e.item_id == item_id and e.output_index == 0 and e.content_index == 0 for e in deltas)
    text = "".join(e.delta for e in deltas)
    assert text == whole.output_text
    assert events[-4].text == text and events[-3].part.text == text and events[-2].item.content[0].text == text
    final = events[-1].response
    assert final.id == events[0].response.id and final.output_text == text
    assert final.status == "incomplete" and final.usage.output_tokens == 12
    assert final.usage.input_tokens == whole.usage.input_tokens


def _continue_dialogue(gateway, tag: str) -> None:
    c = client(gateway)
    system = f"[{tag}] {SYSTEM}"  # a prefix no earlier request has cached
    first_raw = c.responses.with_raw_response.create(
        model=MODEL, input="Good evening! Is the lamp lit?", instructions=system, max_output_tokens=12, temperature=0
    )
    first = first_raw.parse()
    assert first.usage.input_tokens_details.cached_tokens == 0
    second_raw = c.responses.with_raw_response.create(
        model=MODEL,
        input="And the fog?",
        instructions=system,
        previous_response_id=first.id,
        max_output_tokens=12,
        temperature=0,
    )
    second = second_raw.parse()
    assert second.previous_response_id == first.id
    # A returning turn: the same conversation, the same engine, the first turn's prompt and reply cached.
    assert second_raw.headers["x-salon-conversation-id"] == first_raw.headers["x-salon-conversation-id"]
    assert second_raw.headers["x-salon-engine-id"] == first_raw.headers["x-salon-engine-id"]
    details = second.usage.input_tokens_details
    assert details.cached_tokens > 0
    assert details.cached_tokens >= (first.usage.total_tokens // 16) * 16 - 16
    # The history is the earlier input and reply: the chat endpoint's reply to the same messages.
    dialogue = [
        {"role": "user", "content": "Good evening! Is the lamp lit?"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And the fog?"},
    ]
    assert second.output_text == chat_reply(c, dialogue, system)
    # The same history sent back by the client (the first output item as it came) gives the same reply.
    manual = c.responses.create(
        model=MODEL,
        input=[dialogue[0], *first.output, dialogue[2]],
        instructions=system,
        max_output_tokens=12,
        temperature=0,
        store=False,
    )
    assert manual.output_text == second.output_text
    assert c.responses.retrieve(second.id).output_text == second.output_text


def test_previous_response_id_continues_the_dialogue_with_cached_tokens(gateway):
    _continue_dialogue(gateway, "memory")


def test_another_tenant_can_neither_continue_nor_see_a_response(gateway):
    owner, other = client(gateway, KEY_A), client(gateway, KEY_B)
    r = create(owner, "A secret for tenant a only.")
    assert owner.responses.retrieve(r.id).id == r.id  # positive control
    with pytest.raises(openai.NotFoundError) as raised:
        create(other, "Tell me the secret.", previous_response_id=r.id)
    assert raised.value.body["param"] == "previous_response_id"
    assert raised.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(r.id)
    assert owner.responses.retrieve(r.id).id == r.id  # still there for its tenant


def _erased_by_delete_conversation(gateway) -> None:
    c = client(gateway)
    headers = {"x-salon-conversation-id": f"responses-erase-{time.monotonic_ns()}"}
    first = create(c, "Remember the harbour.", extra_headers=headers)
    second_raw = c.responses.with_raw_response.create(
        model=MODEL, input="And the boats?", previous_response_id=first.id, max_output_tokens=4, temperature=0
    )
    # The continuation stays in the named conversation without naming it again.
    assert second_raw.headers["x-salon-conversation-id"] == headers["x-salon-conversation-id"]
    second = second_raw.parse()
    with pytest.raises(openai.BadRequestError) as raised:
        create(c, "Elsewhere?", previous_response_id=first.id, extra_headers={"x-salon-conversation-id": "other"})
    assert raised.value.body["param"] == "x-salon-conversation-id"
    kept = create(c, "A different dialogue.")
    assert c.responses.retrieve(first.id).id == first.id and c.responses.retrieve(second.id).id == second.id
    delete_conversation(gateway, headers["x-salon-conversation-id"])
    for gone in (first.id, second.id):
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(gone)
    with pytest.raises(openai.NotFoundError):
        create(c, "Still there?", previous_response_id=second.id)
    assert c.responses.retrieve(kept.id).id == kept.id


def test_delete_conversation_erases_its_stored_responses(gateway):
    _erased_by_delete_conversation(gateway)


def test_store_false_and_delete_leave_nothing_to_continue(gateway):
    c = client(gateway)
    unstored = create(c, "Do not keep this.", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)
    stored = create(c, "Keep this one for a moment.")
    assert c.responses.retrieve(stored.id).id == stored.id
    c.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        create(c, "Go on.", previous_response_id=stored.id)


def test_a_dialogue_that_fills_the_context_is_refused_before_any_work(gateway):
    c = client(gateway)
    # No budget given: the engine's default, cut to the room left in the context.
    first = c.responses.create(model=MODEL, input="The lamp turns and the sea is calm. " * 20, temperature=0)
    assert first.status == "incomplete" and first.usage.total_tokens == MAX_CONTEXT_TOKENS
    with pytest.raises(openai.BadRequestError) as raised:
        c.responses.create(model=MODEL, input="Go on.", previous_response_id=first.id, max_output_tokens=4)
    error = raised.value.body
    assert error["param"] == "previous_response_id" and error["code"] == "context_length_exceeded"
    assert f"holds {MAX_CONTEXT_TOKENS} tokens" in error["message"]


@pytest.mark.parametrize(
    "fields, status, param",
    [
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, 400, "tools"),
        ({"input": 5}, 400, "input"),
        ({"input": []}, 400, "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, 400, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, 400, "input[0].role"),
        ({"input": [{"role": "user", "content": ""}]}, 400, "input[0].content"),
        ({"input": [{"role": "system", "content": "only a system message"}]}, 400, "input"),
        ({"max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"temperature": "warm"}, 400, "temperature"),
        ({"truncation": "auto"}, 400, "truncation"),
        ({"reasoning": {"effort": "high"}}, 400, "reasoning"),
        ({"text": {"format": {"type": "grammar"}}}, 400, "text.format"),
        (  # refused by the engine's compiler, named as the request names it
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objectx"}}}},
            400,
            "text.format",
        ),
        ({"frobnicate": True}, 400, "frobnicate"),
        ({"previous_response_id": "resp_never_seen"}, 404, "previous_response_id"),
        ({"model": "no-such-model"}, 404, "model"),
    ],
)
def test_bad_input_names_the_field(gateway, fields, status, param):
    body = {"model": MODEL, "input": "Hello", "max_output_tokens": 4, **fields}
    request = urllib.request.Request(
        f"http://127.0.0.1:{gateway.extra_ports['http_port']}/v1/responses",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY_A}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=60)
    assert raised.value.code == status
    error = json.loads(raised.value.read())["error"]
    assert error["param"] == param and param in error["message"]
    assert error["type"] == "invalid_request_error"


def test_redis_store_continues_isolates_and_erases(redis_gateway, redis_store):
    _continue_dialogue(redis_gateway, "redis")
    _erased_by_delete_conversation(redis_gateway)
    c = client(redis_gateway)
    r = create(c, "Kept in Redis.")
    with pytest.raises(openai.NotFoundError):
        client(redis_gateway, KEY_B).responses.retrieve(r.id)
    store = redis.Redis(port=redis_store.port, decode_responses=True)
    [key] = store.keys(f"*{r.id}")
    assert key == f"salon:gateway:response:tenant-a/{r.id}"
    assert 0 < store.pttl(key) <= 3600 * 1000


def test_stored_responses_expire_after_the_session_ttl(engines, redis_store):
    short = _gateway(engines, "gateway-short-ttl", ["--redis-url", redis_store.url, "--session-ttl-s", "3"])
    try:
        c = client(short)
        r = create(c, "Soon forgotten.")
        assert c.responses.retrieve(r.id).id == r.id  # positive control, well within the TTL
        deadline = time.monotonic() + 30
        while True:
            try:
                c.responses.retrieve(r.id)
            except openai.NotFoundError:
                break
            assert time.monotonic() < deadline, "the stored response outlived its TTL"
            time.sleep(0.2)
        with pytest.raises(openai.NotFoundError):
            create(c, "Go on.", previous_response_id=r.id)
    finally:
        short.stop()


def test_a_reply_that_ends_its_turn_is_completed(tmp_path):
    engine = start_service(
        "engine",
        ["--port", "0", "--model", REAL_MODEL, "--engine-id", "e0", "--log-json", "true", *INSECURE_LOOPBACK_FLAGS],
        log_path=tmp_path / "engine.log",
        timeout_s=180,
    )
    gateway = None
    try:
        gateway = start_gateway(
            {"e0": engine}, write_tenants(tmp_path / "tenants.json"), tmp_path, extra=["--http-port", "0"]
        )
        wait_gateway_sees(gateway, 1)
        c = client(gateway)
        ask = dict(model=REAL_MODEL, input="Say hello in one short sentence.", temperature=0, max_output_tokens=48)
        r = c.responses.create(**ask)
        assert r.status == "completed" and r.incomplete_details is None and r.output[0].status == "completed"
        assert 0 < r.usage.output_tokens < 48 and r.output_text
        # The SDK's stream helper accumulates the events and needs the closing response.completed.
        with c.responses.stream(**ask) as stream:
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            final = stream.get_final_response()
        assert final.status == "completed" and final.output_text == text == r.output_text
    finally:
        stop_all([gateway, engine])
