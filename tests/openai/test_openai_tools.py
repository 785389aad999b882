"""Tool calling with the official `openai` package against a running stack serving SmolLM2 (a gateway, one
engine): the tools reach the prompt through the template's fallback (exactly the engine's render; none with
tool_choice "none"), a tool round trip is accepted and its next turn reuses the cached first turn, streamed and
not alike, the gRPC API carries tools too, and bad tool fields are 400s that name the field."""

from __future__ import annotations

import json

import grpc
import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.engine.api.prompt import Character, ChatMessage, PromptRenderer, Role, ToolCallSpec, ToolSpec
from salon.engine.model.chat_renderer import ChatRenderer
from salon.engine.model.loader import open_model_file
from salon.engine.model.tokenizer import Tokenizer
from salon.gateway.tool_calls import parse_reply
from tests.openai.openai_stack import KEY, start_stack, stop_stack

REAL_MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a weather assistant."
ASK = "What is the weather in Paris?"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The current weather of a city", "parameters": PARAMETERS},
}
# Past a schema shape limit (salon/common/schema_shape.py): refused for a forced call by the gateway, naming the tool.
HUGE_ENUM = {"type": "object", "properties": {"c": {"enum": [f"v{i}" for i in range(1025)]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    flags = ("--model", REAL_MODEL, "--kv-cache-bytes", str(128 << 20))
    s = start_stack(tmp_path_factory.mktemp("tools"), num_engines=1, engine_flags=flags)
    try:
        yield s
    finally:
        stop_stack(s)


@pytest.fixture(scope="module")
def local():
    mf = open_model_file(REAL_MODEL)
    return PromptRenderer(ChatRenderer(Tokenizer(mf.vocab), mf.chat_template, mf.config.eos_token_ids))


def opening() -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]


def round_trip() -> list[dict]:
    return opening() + [
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21, "sky": "clear"}'},
    ]


def ask(client, messages, **kw):
    kw.setdefault("max_tokens", 16)
    return client.chat.completions.create(model=REAL_MODEL, messages=messages, temperature=0, **kw)


def test_tools_reach_the_prompt_and_tool_choice_none_leaves_them_out(stack, local):
    client = stack.client()
    spec = ToolSpec("get_weather", "The current weather of a city", PARAMETERS)
    messages = [ChatMessage(Role.USER, ASK)]
    with_tools = local.render_prompt(Character("", SYSTEM), messages, tools=(spec,)).token_ids
    without = local.render_prompt(Character("", SYSTEM), messages).token_ids
    assert len(with_tools) > len(without) + 100
    assert ask(client, opening(), tools=[WEATHER], max_tokens=1).usage.prompt_tokens == len(with_tools)
    none = ask(client, opening(), tools=[WEATHER], tool_choice="none", max_tokens=1)
    assert none.usage.prompt_tokens == len(without)
    assert ask(client, opening(), tools=[WEATHER], tool_choice="auto", max_tokens=1).usage.prompt_tokens == len(
        with_tools
    )


def test_a_tool_round_trip_is_accepted_and_its_next_turn_hits_the_cache(stack):
    client = stack.client()
    first = ask(client, opening(), tools=[WEATHER], max_tokens=24)
    assert first.choices[0].finish_reason in ("stop", "length", "tool_calls")
    second = ask(client, round_trip(), tools=[WEATHER], max_tokens=24)
    details = second.usage.prompt_tokens_details
    # The first turn's prompt is the beginning of the second's: its whole blocks come from the cache.
    assert details.cached_tokens > 0
    assert details.cached_tokens >= first.usage.prompt_tokens // 16 * 16 - 16
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # The same turn streamed, assembled by the SDK's stream accumulator (that of client.chat.completions.stream,
    # whose get_final_completion refuses a reply cut by max_tokens), is the same message.
    state = ChatCompletionStreamState(input_tools=[WEATHER])
    for chunk in ask(client, round_trip(), tools=[WEATHER], max_tokens=24, stream=True):
        state.handle_chunk(chunk)
    streamed = state.current_completion_snapshot.choices[0]
    whole = second.choices[0]
    assert streamed.message.content == whole.message.content
    assert [(t.function.name, t.function.arguments) for t in streamed.message.tool_calls or []] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls or []
    ]
    assert streamed.finish_reason == whole.finish_reason


def test_the_grpc_api_carries_tools_and_tool_messages(stack, local):
    tool = chat_pb2.Tool(name="get_weather", description="The current weather of a city")
    tool.parameters_json = json.dumps(PARAMETERS)
    call = chat_pb2.ToolCall(id="call_1", name="get_weather", arguments_json='{"city": "Paris"}')
    messages = [
        chat_pb2.Message(role=chat_pb2.ROLE_USER, text=ASK),
        chat_pb2.Message(role=chat_pb2.ROLE_CHARACTER, tool_calls=[call]),
        chat_pb2.Message(role=chat_pb2.ROLE_TOOL, text='{"temp_c": 21}', tool_call_id="call_1"),
    ]
    request = chat_pb2.GenerateRequest(
        conversation_id="grpc-tools",
        model=REAL_MODEL,
        character=chat_pb2.Character(definition=SYSTEM),
        dialogue=chat_pb2.Dialogue(messages=messages),
        sampling=chat_pb2.SamplingParams(max_new_tokens=1, temperature=0),
        tools=[tool],
    )
    with grpc.insecure_channel(stack.gateway.address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        events = list(stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=60))
    final = events[-1].final
    spec = ToolSpec("get_weather", "The current weather of a city", PARAMETERS)
    expected = local.render_prompt(
        Character("", SYSTEM),
        [
            ChatMessage(Role.USER, ASK),
            ChatMessage(Role.CHARACTER, tool_calls=(ToolCallSpec("call_1", "get_weather", '{"city": "Paris"}'),)),
            ChatMessage(Role.TOOL, '{"temp_c": 21}', tool_call_id="call_1"),
        ],
        tools=(spec,),
    ).token_ids
    assert final.usage.prompt_tokens == len(expected)


TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}, "hour24": {"type": "boolean"}},
            "required": ["zone", "hour24"],
        },
    },
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_a_forced_call_is_a_valid_call_of_an_offered_tool(stack, choice, stream):
    """tool_choice "required" or a named function: even the 135M model answers with a call whose arguments
    validate against the tool's schema, sampled at temperature 1 for several seeds, streamed or not."""
    client = stack.client()
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for seed in range(5):
        kw = dict(tools=[WEATHER, TIME], tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=96)
        kw.update(temperature=1, seed=seed)
        if stream:
            state = ChatCompletionStreamState()
            for chunk in client.chat.completions.create(model=REAL_MODEL, messages=opening(), stream=True, **kw):
                state.handle_chunk(chunk)
            choice0 = state.get_final_completion().choices[0]
        else:
            choice0 = client.chat.completions.create(model=REAL_MODEL, messages=opening(), **kw).choices[0]
        assert choice0.finish_reason == "tool_calls", (seed, choice0)
        calls = choice0.message.tool_calls
        assert len(calls) == 1, calls
        name = calls[0].function.name
        assert name in schemas and (choice == "required" or name == choice), calls
        jsonschema.validate(json.loads(calls[0].function.arguments), schemas[name])


def test_bad_tool_fields_are_400_naming_the_field(stack):
    client = stack.client()

    def tool(**function) -> dict:
        return {"type": "function", "function": {"name": "get_weather", **function}}

    def call(arguments) -> list[dict]:
        bad = {**CALL, "function": {"name": "get_weather", "arguments": arguments}}
        return opening() + [{"role": "assistant", "tool_calls": [bad]}]

    cases = [
        (dict(tools=[tool(name="get weather")]), "tools[0].function.name"),
        (dict(tools=[tool(name="")]), "tools[0].function.name"),
        (dict(tools=[{"type": "retrieval"}]), "tools[0].type"),
        (dict(tools=[tool(), tool()]), "tools[1].function.name"),
        (dict(tools=[tool(parameters={"type": "string"})]), "tools[0].function.parameters.type"),
        (dict(tools=[tool(parameters=[1])]), "tools[0].function.parameters"),
        (dict(tools=[tool(description="x" * 5000)]), "tools[0].function.description"),
        (dict(tools=[tool(strict=True, parameters=PARAMETERS)]), "tools[0].function.strict"),
        (dict(tools=[tool(name=f"f{i}") for i in range(129)]), "tools"),
        (
            dict(tools=[tool(parameters=HUGE_ENUM)], tool_choice="required"),
            "tools[0].function.parameters: enum at /properties/c/enum has 1025 values, more than 1024",
        ),
        (dict(tools=[tool()], tool_choice="sometimes"), "tool_choice"),
        (
            dict(tools=[tool()], tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice.function.name",
        ),
        (dict(tool_choice="required"), "tool_choice: 'required' needs tools"),
        (dict(tools=[tool()], parallel_tool_calls="yes"), "parallel_tool_calls"),
        (dict(messages=call("{not json")), "messages[2].tool_calls[0].function.arguments"),
        (dict(messages=call("[1, 2]")), "messages[2].tool_calls[0].function.arguments"),
        (dict(messages=opening() + [{"role": "tool", "content": "21"}]), "messages[2].tool_call_id"),
        (dict(messages=opening() + [{"role": "assistant", "content": None}]), "messages[2].content"),
        (dict(functions=[{"name": "f"}]), "functions"),
        (
            dict(tools=[tool()], tool_choice="required", response_format={"type": "json_object"}),
            "tool_choice: 'required' cannot be combined with another structured output constraint",
        ),
    ]
    for kw, message in cases:
        kw.setdefault("messages", opening())
        param = message.split(":")[0]
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=REAL_MODEL, max_tokens=1, **kw)
        body = err.value.body
        assert err.value.status_code == 400 and body["param"] == param, (kw, body)
        assert body["message"].startswith(message) and body["type"] == "invalid_request_error", body


def _fragments(chunks) -> dict[int, list[dict]]:
    """Per call index, its tool_calls deltas as they came."""
    out: dict[int, list[dict]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                out.setdefault(delta.index, []).append(delta.model_dump(exclude_none=True))
    return out


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_streamed_arguments_come_in_fragments_that_join_to_the_whole_reply(stack, tool_choice):
    """At temperature 1 over seeds, a streamed reply (assembled by the SDK's stream accumulator) is the same message
    as the reply not streamed: content, calls' names and arguments (the fragments joined), finish reason. Each
    call's first delta has its index, id, type and name and arguments ""; forced calls' arguments arrive in
    several fragments as they are generated. (With "auto" the 135M model answers these seeds in text, one of them
    opening a ``` fence that turns out to be no call: the content streams whole through the parser.)"""
    client = stack.client()
    fragmented = 0
    for seed in range(5):
        kw = dict(model=REAL_MODEL, messages=opening(), tools=[WEATHER, TIME], tool_choice=tool_choice)
        kw.update(temperature=1, seed=seed, max_tokens=48)
        if tool_choice == "required":
            kw.update(parallel_tool_calls=False, max_tokens=96)
        whole = client.chat.completions.create(**kw).choices[0]
        if tool_choice == "required":
            assert whole.finish_reason == "tool_calls", whole
            with client.chat.completions.stream(**kw) as stream:
                chunks = [event.chunk for event in stream if event.type == "chunk"]
                streamed = stream.get_final_completion().choices[0]
        else:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            state = ChatCompletionStreamState()
            for chunk in chunks:
                state.handle_chunk(chunk)
            streamed = state.current_completion_snapshot.choices[0]
        assert streamed.message.content == whole.message.content, seed
        calls = [(t.function.name, t.function.arguments) for t in whole.message.tool_calls or []]
        assert [(t.function.name, t.function.arguments) for t in streamed.message.tool_calls or []] == calls, seed
        assert streamed.finish_reason == whole.finish_reason, seed
        for index, deltas in _fragments(chunks).items():
            head = deltas[0]
            assert head["id"].startswith("call_") and head["type"] == "function", head
            assert head["function"] == {"name": calls[index][0], "arguments": ""}, head
            assert all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in deltas[1:])
            assert "".join(d["function"]["arguments"] for d in deltas) == calls[index][1]
            fragmented += len(deltas) > 2
    if tool_choice == "required":
        assert fragmented >= 3, fragmented


def _grpc_request(seed: int, tool_choice: chat_pb2.ToolChoice) -> chat_pb2.GenerateRequest:
    tools = [
        chat_pb2.Tool(name=t["function"]["name"], parameters_json=json.dumps(t["function"]["parameters"]))
        for t in (WEATHER, TIME)
    ]
    return chat_pb2.GenerateRequest(
        conversation_id=f"grpc-forced-{seed}",
        model=REAL_MODEL,
        character=chat_pb2.Character(definition=SYSTEM),
        dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, text=ASK)]),
        sampling=chat_pb2.SamplingParams(max_new_tokens=96, temperature=1, seed=seed),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
    )


@pytest.mark.parametrize("function", ["", "get_time"])
def test_grpc_forced_calls_stream_and_end_whole_and_valid(stack, function):
    """Over gRPC, REQUIRED and FUNCTION are enforced as over HTTP: the final has one call whose arguments validate
    against its tool's schema and FINISH_REASON_TOOL_CALLS; streamed, the deltas' content is empty and their
    ToolCallDelta pieces join to the final's call (id and name first, then argument fragments)."""
    mode = chat_pb2.TOOL_CHOICE_MODE_FUNCTION if function else chat_pb2.TOOL_CHOICE_MODE_REQUIRED
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    with grpc.insecure_channel(stack.gateway.address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        for seed in range(3):
            request = _grpc_request(seed, chat_pb2.ToolChoice(mode=mode, function_name=function))
            events = list(stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=60))
            final = events[-1].final
            assert final.finish_reason == chat_pb2.FINISH_REASON_TOOL_CALLS, (seed, final)
            assert len(final.tool_calls) == 1, final
            call = final.tool_calls[0]
            assert call.id.startswith("call_") and call.name in schemas and (call.name == function or not function)
            jsonschema.validate(json.loads(call.arguments_json), schemas[call.name])
            deltas = [e.delta for e in events[:-1]]
            assert all(d.HasField("content") and d.content == "" for d in deltas)
            pieces = [p for d in deltas for p in d.tool_calls]
            assert pieces[0] == chat_pb2.ToolCallDelta(index=0, id=call.id, name=call.name)
            assert all(p.index == 0 and not p.id and not p.name for p in pieces[1:])
            assert "".join(p.arguments_json for p in pieces) == call.arguments_json
            assert len(pieces) > 2, pieces


def test_grpc_refuses_a_forced_choice_it_cannot_serve(stack):
    with grpc.insecure_channel(stack.gateway.address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        cases = [
            (chat_pb2.ToolChoice(mode=chat_pb2.TOOL_CHOICE_MODE_FUNCTION, function_name="nope"), None, "tool_choice."),
            (
                chat_pb2.ToolChoice(mode=chat_pb2.TOOL_CHOICE_MODE_REQUIRED),
                chat_pb2.Constraint(json_object=True),
                "tool_choice: REQUIRED cannot be combined with sampling.constraint",
            ),
        ]
        hostile = chat_pb2.ToolChoice(mode=chat_pb2.TOOL_CHOICE_MODE_REQUIRED)
        cases.append((hostile, None, "tools[1].parameters_json: enum at /properties/c/enum has 1025 values"))
        for choice, constraint, message in cases:
            request = _grpc_request(0, choice)
            if constraint is not None:
                request.sampling.constraint.CopyFrom(constraint)
            if choice is hostile:
                request.tools[1].parameters_json = json.dumps(HUGE_ENUM)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=60))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details().startswith(message), err.value.details()


def test_an_engine_asked_directly_constrains_a_forced_call_itself(stack):
    """The engine's own client (no gateway) with FUNCTION: the reply's text is a valid call of that tool."""
    request = _grpc_request(1, chat_pb2.ToolChoice(mode=chat_pb2.TOOL_CHOICE_MODE_FUNCTION, function_name="get_time"))
    engine_request = engine_pb2.GenerateRequest(
        request_id="direct-forced",
        conversation_id=request.conversation_id,
        character=request.character,
        dialogue=request.dialogue,
        sampling=request.sampling,
        tools=request.tools,
        tool_choice=request.tool_choice,
        parallel_tool_calls=False,
    )
    with grpc.insecure_channel(stack.engines["e0"].address) as channel:
        events = list(engine_pb2_grpc.EngineServiceStub(channel).Generate(engine_request, timeout=60))
    text = "".join(e.delta.text for e in events if e.HasField("delta"))
    reply = parse_reply(text, ["get_weather", "get_time"])
    assert reply.content is None and [c.name for c in reply.calls] == ["get_time"], text
    jsonschema.validate(json.loads(reply.calls[0].arguments), TIME["function"]["parameters"])
