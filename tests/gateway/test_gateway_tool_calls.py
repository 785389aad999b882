"""Replies parsed into tool calls (salon/gateway/tool_calls.py) on recorded outputs of each style, and the
chat completion built from them (completion.py): streamed in fragments, the SDK's own stream accumulator
(ChatCompletionStreamState, what client.chat.completions.stream uses) assembles exactly the non-streamed
message; the reply schema a forced tool_choice decodes under, and its shape checked before it goes anywhere; the
gRPC stream of a reply with tools."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from opentelemetry import trace

from salon.api.chat.v1 import chat_pb2
from salon.common.tool_call_schema import reply_schema
from salon.gateway.http.choices import ChoiceEvent
from salon.gateway.http.completion import Completion
from salon.gateway.tool_call_events import ToolCallEvents
from salon.gateway.tool_calls import ParsedCall, ParsedReply, parse_reply
from salon.gateway.tool_choice import ToolReplies, ToolSchemaRefused, apply_tool_choice

TOOLS = ["get_weather", "get_time"]
PARIS = ParsedCall("get_weather", '{"city": "Paris"}')
NOW = ParsedCall("get_time", '{"zone": "UTC"}')

# (recorded reply, its parse)
RECORDED = {
    "hermes": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
        ParsedReply("Let me check.", [PARIS, NOW]),
    ),
    "hermes, arguments as a string, unclosed at the end": (
        '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}',
        ParsedReply(None, [NOW]),
    ),
    "hermes, text after the call": (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\nDone.',
        ParsedReply("\nDone.", [PARIS]),
    ),
    "llama 3": ('{"name": "get_weather", "parameters": {"city": "Paris"}}', ParsedReply(None, [PARIS])),
    "llama 3, python tag, two calls": (
        '<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"zone": "UTC"}}',
        ParsedReply(None, [PARIS, NOW]),
    ),
    "generic, fenced array": (
        '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```',
        ParsedReply(None, [PARIS]),
    ),
    "generic, openai shape": (
        '{"tool_calls": [{"type": "function", "function": '
        '{"name": "get_time", "arguments": "{\\"zone\\":\\"UTC\\"}"}}]}',
        ParsedReply(None, [NOW]),
    ),
    "plain text": ("  The sky is clear.\n", ParsedReply("  The sky is clear.\n", [])),
    "json that is no call": ('{"city": "Paris"}', ParsedReply('{"city": "Paris"}', [])),
    "a tool not offered": (
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        ParsedReply('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', []),
    ),
    "broken json in the block": (
        'Hi <tool_call>{"name": "get_time", </tool_call>',
        ParsedReply('Hi <tool_call>{"name": "get_time", </tool_call>', []),
    ),
    "a tag cut short": ("It is <tool_ca", ParsedReply("It is <tool_ca", [])),
}


@pytest.mark.parametrize("name", list(RECORDED))
def test_recorded_replies_parse(name):
    text, want = RECORDED[name]
    assert parse_reply(text, TOOLS) == want


def test_parallel_tool_calls_false_keeps_the_first_call():
    text, _ = RECORDED["hermes"]
    assert parse_reply(text, TOOLS, parallel_tool_calls=False) == ParsedReply("Let me check.", [PARIS])


async def _events(pieces: list[str], finish: int) -> ...:
    for piece in pieces:
        yield ChoiceEvent(0, chat_pb2.GenerateResponse(delta=chat_pb2.TokenDelta(text=piece, token_ids=[1])))
    usage = chat_pb2.Usage(prompt_tokens=5, generated_tokens=len(pieces))
    yield ChoiceEvent(0, chat_pb2.GenerateResponse(final=chat_pb2.GenerateFinal(finish_reason=finish, usage=usage)))


def _completion(pieces: list[str], finish: int = chat_pb2.FINISH_REASON_STOP_TOKEN) -> Completion:
    return Completion(
        kind="chat",
        response_id="chatcmpl-test",
        model="m",
        num_choices=1,
        events=_events(pieces, finish),
        span=trace.INVALID_SPAN,
        release=lambda: None,
        logprobs=False,
        include_usage=False,
        arrived_s=0.0,
        tool_names=TOOLS,
    )


def _streamed(pieces: list[str], finish: int = chat_pb2.FINISH_REASON_STOP_TOKEN):
    async def run():
        c = _completion(pieces, finish)
        return [chunk async for chunk in c.sse(await c.first())]

    state = ChatCompletionStreamState()
    for line in asyncio.run(run()):
        data = line.removeprefix("data: ").strip()
        if data != "[DONE]":
            state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(data)))
    return state.get_final_completion().choices[0]


def _whole(pieces: list[str], finish: int = chat_pb2.FINISH_REASON_STOP_TOKEN) -> dict:
    return asyncio.run(_completion(pieces, finish).body())["choices"][0]


def _calls(message) -> list[tuple[str, str]]:
    return [(t.function.name, t.function.arguments) for t in message.tool_calls or []]


@pytest.mark.parametrize("name", list(RECORDED))
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streamed_fragments_assemble_to_the_whole_reply(name, size):
    text, want = RECORDED[name]
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    whole = _whole(pieces)
    streamed = _streamed(pieces)
    expected_calls = [(c.name, c.arguments) for c in want.calls]
    assert whole["message"]["content"] == want.content
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in whole["message"].get("tool_calls", [])] == (
        expected_calls
    )
    assert streamed.message.content == want.content
    assert _calls(streamed.message) == expected_calls
    assert all(t.id.startswith("call_") and t.type == "function" for t in streamed.message.tool_calls or [])
    assert all(t["id"].startswith("call_") for t in whole["message"].get("tool_calls", []))
    finish = "tool_calls" if want.calls else "stop"
    assert whole["finish_reason"] == streamed.finish_reason == finish


def test_a_reply_cut_by_the_budget_keeps_its_finish_reason():
    text, _ = RECORDED["llama 3"]
    assert _whole([text], chat_pb2.FINISH_REASON_LENGTH)["finish_reason"] == "length"


def test_reply_schema_of_a_forced_choice():
    functions = [
        {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
        {"name": "get_time"},
    ]
    assert reply_schema(functions, None, required=False, parallel_tool_calls=True) is None
    named = reply_schema(functions, "get_time", required=False, parallel_tool_calls=False)
    assert named == {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": ["get_time"]}, "arguments": {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 1,
    }
    required = reply_schema(functions, None, required=True, parallel_tool_calls=True)
    assert [v["properties"]["name"]["enum"] for v in required["items"]["anyOf"]] == [["get_weather"], ["get_time"]]
    assert required["items"]["anyOf"][0]["properties"]["arguments"] == functions[0]["parameters"]
    assert "maxItems" not in required
    # A reply that follows the schema parses into exactly its calls.
    reply = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])
    assert parse_reply(reply, TOOLS) == ParsedReply(None, [PARIS])


def _deep(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _forced(parameters: list[dict], mode=chat_pb2.TOOL_CHOICE_MODE_REQUIRED) -> chat_pb2.GenerateRequest:
    tools = [chat_pb2.Tool(name=f"f{i}", parameters_json=json.dumps(p)) for i, p in enumerate(parameters)]
    return chat_pb2.GenerateRequest(tools=tools, tool_choice=chat_pb2.ToolChoice(mode=mode))


def test_a_forced_calls_schema_past_a_shape_limit_is_refused_naming_the_tool():
    """Each tool's parameters, then the calls' schema that nests them (two levels per nested object, and the calls'
    array and item around them), are checked against salon/common/schema_shape.py's limits before any engine
    sees them: the refusal names the tool whose parameters exceed one, or the calls' schema as a whole."""
    fine = {"type": "object", "properties": {"city": {"type": "string"}}}
    enum = {"type": "object", "properties": {"c": {"enum": [f"v{i}" for i in range(1025)]}}}
    with pytest.raises(ToolSchemaRefused) as refused:
        apply_tool_choice(_forced([fine, enum]))
    assert refused.value.tool_index == 1
    assert (
        refused.value.message == "tools[1].parameters_json: enum at /properties/c/enum has 1025 values, more than 1024"
    )
    # Within the limit alone, past it once nested in the calls' schema.
    with pytest.raises(ToolSchemaRefused) as refused:
        apply_tool_choice(_forced([fine, _deep(30)]))
    assert refused.value.tool_index is None
    assert refused.value.message.startswith(
        "tools: in the calls' schema: nested more than 64 levels deep (at /items/anyOf/1/properties/arguments/"
    ), refused.value.message
    # At the limits: the constraint is set, the engine gets AUTO.
    at_limit = _forced([fine, _deep(29), {"type": "object", "properties": {"c": {"enum": list(range(1024))}}}])
    apply_tool_choice(at_limit)
    assert at_limit.sampling.constraint.json_schema.strict
    assert at_limit.tool_choice.mode == chat_pb2.TOOL_CHOICE_MODE_AUTO
    # Under AUTO nothing compiles: the same parameters only describe the tool in the prompt.
    assert apply_tool_choice(_forced([enum], chat_pb2.TOOL_CHOICE_MODE_AUTO)).tool_names == ("f0",)


def _grpc_events(pieces: list[str], finish: int) -> list[chat_pb2.GenerateResponse]:
    adapter = ToolCallEvents(ToolReplies(tuple(TOOLS), parallel_tool_calls=True))
    out = []
    for piece in pieces:
        out += adapter.events(chat_pb2.GenerateResponse(delta=chat_pb2.TokenDelta(text=piece, token_ids=[1])))
    return out + adapter.events(chat_pb2.GenerateResponse(final=chat_pb2.GenerateFinal(finish_reason=finish)))


def test_grpc_events_carry_content_call_pieces_and_the_whole_calls():
    """The gRPC stream of a reply with tools (tool_call_events.py): every delta keeps its text and tokens and adds
    its content and call pieces; what the parser held comes in one delta without tokens before the final; the
    final has the whole calls and FINISH_REASON_TOOL_CALLS."""
    pieces = [
        "Let me",
        " check.\n<tool_call>",
        '{"name": "get_weather", "arguments": {"city": "Pa',
        'ris"}}</tool_call>',
        "\n",
    ]
    pieces.append('<tool_call>{"name": "get_time", "arguments": {}}</tool_call> ok')
    events = _grpc_events(pieces, chat_pb2.FINISH_REASON_STOP_TOKEN)
    deltas, final = [e.delta for e in events[:-1]], events[-1].final
    assert [(d.text, list(d.token_ids)) for d in deltas] == [(p, [1]) for p in pieces]
    assert [d.content for d in deltas] == ["Let me", " check.", "", "", "", " ok"]
    weather, clock = final.tool_calls
    assert (weather.name, weather.arguments_json, clock.name, clock.arguments_json) == (
        "get_weather",
        '{"city": "Paris"}',
        "get_time",
        "{}",
    )
    assert [(p.index, p.id, p.name, p.arguments_json) for d in deltas for p in d.tool_calls] == [
        (0, weather.id, "get_weather", ""),
        (0, "", "", '{"city": "Pa'),
        (0, "", "", 'ris"}'),
        (1, clock.id, "get_time", ""),
        (1, "", "", "{}"),
    ]
    assert weather.id.startswith("call_") and clock.id.startswith("call_") and weather.id != clock.id
    assert final.finish_reason == chat_pb2.FINISH_REASON_TOOL_CALLS


def test_grpc_events_flush_held_text_and_keep_length():
    events = _grpc_events(["It is <tool_ca"], chat_pb2.FINISH_REASON_STOP_TOKEN)
    assert [e.delta.content for e in events[:-1]] == ["It is", " <tool_ca"]
    assert list(events[1].delta.token_ids) == [] and events[-1].final.finish_reason == 1
    cut = _grpc_events(['[{"name": "get_time", "arguments": {"zone"'], chat_pb2.FINISH_REASON_LENGTH)
    assert cut[-1].final.finish_reason == chat_pb2.FINISH_REASON_LENGTH
    assert [(c.name, c.arguments_json) for c in cut[-1].final.tool_calls] == [("get_time", '{"zone"')]
