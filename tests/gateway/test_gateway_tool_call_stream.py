"""The tool-call parser as it streams (salon/gateway/tool_calls.py): exact pieces out for hand-written pieces of
replies in each form (content at once, a call's head when its arguments start, then the arguments as they come,
written as json.dumps writes them), and for every way to cut a reply in two or three pieces the same reply as
the one-shot parse."""

from __future__ import annotations

import json

import pytest

from salon.gateway.tool_calls import (
    CallArguments,
    CallStart,
    ParsedCall,
    ParsedReply,
    ToolCallParser,
    assemble,
    parse_reply,
)

TOOLS = ["get_weather", "get_time"]


def _stream(pieces: list[str], parallel: bool = True) -> list[list]:
    parser = ToolCallParser(TOOLS, parallel)
    return [parser.feed(p) for p in pieces] + [parser.finish()]


def test_hermes_text_then_a_call_whose_arguments_stream():
    pieces = ["Let me", " check.\n<tool", '_call>\n{"name": "get_weather", "argu', 'ments": {"city": "Pa']
    pieces.append('ris"}}\n</tool_call>')
    assert _stream(pieces) == [
        ["Let me"],
        [" check."],  # the blank and what may open a tag are held
        [],  # the name alone starts nothing
        [CallStart(0, "get_weather"), CallArguments(0, '{"city": "Pa')],
        [CallArguments(0, 'ris"}')],
        [],
    ]


def test_a_constrained_array_of_two_calls_streams_each_in_turn():
    pieces = [
        '[{"name":"get_',
        'weather","arguments":{"city":"Paris",',
        '"days":3}},{"name":"get_time","arguments":{}}]',
    ]
    assert _stream(pieces) == [
        [],
        [CallStart(0, "get_weather"), CallArguments(0, '{"city": "Paris", ')],
        [CallArguments(0, '"days": 3}'), CallStart(1, "get_time"), CallArguments(1, "{}")],
        [],
    ]


def test_arguments_given_as_a_string_stream_as_the_object_it_holds():
    pieces = ['<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"UT', 'C\\"}"}</tool_call>']
    assert _stream(pieces) == [
        [CallStart(0, "get_time"), CallArguments(0, '{"zone": "UT')],
        [CallArguments(0, 'C"}')],
        [],
    ]


def test_arguments_before_the_name_start_with_the_name():
    pieces = ['<tool_call>{"arguments": {"zone": "UTC"}, ', '"name": "get_time"}</tool_call>']
    assert _stream(pieces) == [[], [CallStart(0, "get_time"), CallArguments(0, '{"zone": "UTC"}')], []]


def test_json_that_is_no_call_is_content_as_written():
    assert _stream(['{"city":', ' "Paris"}']) == [[], ['{"city": "Paris"}'], []]
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call> ok'
    named = text.index('"arg')  # the name is read: the block is text (its blank end held)
    assert _stream([text[:named], text[named:]]) == [[text[: named - 1]], [text[named - 1 :]], []]
    assert _stream([text[:20], text[20:]]) == [[], [text], []]


def test_without_parallel_tool_calls_only_the_first_call_streams():
    pieces = ['[{"name":"get_weather","arguments":{"city":"Paris"}},', '{"name":"get_time","arguments":{}}]']
    assert _stream(pieces, parallel=False) == [
        [CallStart(0, "get_weather"), CallArguments(0, '{"city": "Paris"}')],
        [],
        [],
    ]


def test_a_call_cut_short_keeps_the_arguments_it_streamed():
    assert _stream(['[{"name":"get_weather","arguments":{"ci', "ty"]) == [
        [CallStart(0, "get_weather"), CallArguments(0, '{"ci')],
        [CallArguments(0, "ty")],
        [],
    ]


REPLIES = {
    "hermes, two calls": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    ),
    "hermes, text after": '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>\nDone.',
    "hermes, arguments first, escapes and numbers": (
        '<tool_call>{"arguments": {"a": [1, 2.50, -0, 1E2, true, null, "x\\u00e9\\n\\ud83d\\ude00\\/"]}, '
        '"name": "get_time"}</tool_call> ok'
    ),
    "hermes, arguments as a string, unclosed": '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": 1}"}',
    "constrained array": (
        '[{"name":"get_weather","arguments":{"city":"Paris","n":{"x":[]}}},{"name":"get_time","arguments":{}}]'
    ),
    "llama 3, python tag, two calls": (
        '<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"zone": "UTC"}}'
    ),
    "fenced": '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```',
    "openai shape": '{"tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}',
    "json, then text and a block": (
        '{"name": "get_time"} and more <tool_call>{"name":"get_weather","arguments":{}}</tool_call>'
    ),
    "json that is no call": '  {"city": "Paris"}',
    "a tool not offered, then a call": 'a <tool_call>{"name":"zz"} <tool_call>{"name":"get_time"}</tool_call> b',
    "broken block": 'Hi <tool_call>{"name": "get_time", </tool_call>',
    "broken after the call started": '<tool_call>{"name":"get_weather","arguments":{"city" 1}}</tool_call>tail',
    "cut short": '[{"name":"get_weather","arguments":{"city":"Par',
    "plain text with a tag cut short": "It is <tool_ca",
    "blanks": "  \n ",
}


@pytest.mark.parametrize("name", list(REPLIES))
def test_every_cut_streams_the_one_shot_reply(name):
    text = REPLIES[name]
    want = parse_reply(text, TOOLS)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3 if len(text) > 60 else 1):
            pieces = [p for chunk in _stream([text[:i], text[i:j], text[j:]]) for p in chunk]
            assert assemble(pieces) == want, (i, j)
            heads = [p.index for p in pieces if isinstance(p, CallStart)]
            assert heads == list(range(len(want.calls)))


def test_the_one_shot_parses():
    """The replies above parse as they should: complete arguments are json.dumps of what the model wrote."""
    got = {name: parse_reply(text, TOOLS) for name, text in REPLIES.items()}
    paris, utc = '{"city": "Paris"}', '{"zone": "UTC"}'
    assert got["hermes, two calls"] == ParsedReply(
        "Let me check.", [ParsedCall("get_weather", paris), ParsedCall("get_time", utc)]
    )
    assert got["hermes, text after"] == ParsedReply("\nDone.", [ParsedCall("get_weather", paris)])
    escapes = json.dumps({"a": [1, 2.5, 0, 100.0, True, None, "x\u00e9\n\U0001f600/"]}, ensure_ascii=False)
    assert got["hermes, arguments first, escapes and numbers"] == ParsedReply(" ok", [ParsedCall("get_time", escapes)])
    assert got["hermes, arguments as a string, unclosed"] == ParsedReply(None, [ParsedCall("get_time", '{"zone": 1}')])
    assert got["constrained array"] == ParsedReply(
        None, [ParsedCall("get_weather", '{"city": "Paris", "n": {"x": []}}'), ParsedCall("get_time", "{}")]
    )
    assert got["llama 3, python tag, two calls"] == ParsedReply(
        None, [ParsedCall("get_weather", paris), ParsedCall("get_time", utc)]
    )
    assert got["fenced"] == ParsedReply(None, [ParsedCall("get_weather", paris)])
    assert got["openai shape"] == ParsedReply(None, [ParsedCall("get_time", "{}")])
    assert got["json, then text and a block"] == ParsedReply(
        " and more", [ParsedCall("get_time", "{}"), ParsedCall("get_weather", "{}")]
    )
    for name in ("json that is no call", "a tool not offered, then a call", "broken block", "blanks"):
        assert got[name] == ParsedReply(REPLIES[name], []), name
    assert got["plain text with a tag cut short"] == ParsedReply("It is <tool_ca", [])
    assert got["broken after the call started"] == ParsedReply("tail", [ParsedCall("get_weather", '{"city"')])
    assert got["cut short"] == ParsedReply(None, [ParsedCall("get_weather", '{"city": "Par')])
