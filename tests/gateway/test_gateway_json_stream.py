"""JSON read a character at a time (salon/gateway/json_stream.py): the canonical texts of a value's tokens joined
are json.dumps of the value, the value is complete at its last character, and text that is not JSON is refused
as soon as the token out of place is read (a number or literal ends at the character after it)."""

from __future__ import annotations

import json

import pytest

from salon.gateway.json_stream import JsonValue, Lexer, NotJson, canonical


def _read(text: str) -> tuple[str, int | None]:
    """(the canonical text, the index of the character that completed the value)."""
    lexer, value, out, done_at = Lexer(), JsonValue(), [], None
    for i, ch in enumerate(text + " "):
        for tok in lexer.push(ch):
            out.append(canonical(tok))
            if value.token(tok):
                done_at = i
    return "".join(out), done_at


@pytest.mark.parametrize(
    "text",
    [
        '{"city":"Paris","days":3}',
        '{ "a" : [ 1 , -2.50 , 1E2 , -0 , 0.001e-3 , true , false , null ] , "b" : { } , "c" : [ ] }',
        '{"s": "tab\\there \\"quoted\\" \\\\ \\/ \\u00e9 \\ud83d\\ude00 caf\u00e9 \\n"}',
        '[{"x": {"y": [[], [{}]]}}]',
        '"just a string"',
        "12345678901234567890",
    ],
)
def test_tokens_joined_are_json_dumps_of_the_value(text):
    out, done_at = _read(text)
    assert out == json.dumps(json.loads(text), ensure_ascii=False)
    assert done_at == len(text.rstrip()) - 1 or (done_at == len(text) and text[-1].isdigit())


def test_a_lone_surrogate_stays_an_escape():
    assert _read('"a\\ud800b"')[0] == '"a\\ud800b"'


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ('{"a" 1}', 6),
        ('{"a": tru}', 9),
        ('{"a": 01}', 8),
        ("[1,]", 3),
        ('{"a": "\\q"}', 8),
        ('"a\nb"', 2),
        ("{'a': 1}", 1),
    ],
)
def test_not_json_is_refused_where_it_shows(text, at):
    lexer, value = Lexer(), JsonValue()
    for i, ch in enumerate(text):
        try:
            for tok in lexer.push(ch):
                value.token(tok)
        except NotJson:
            assert i == at, (text, i)
            return
    pytest.fail(f"{text!r} was read as JSON")
