"""A reply's text parsed into OpenAI tool calls, incrementally, so a stream and a whole reply agree.

Three forms of a call are recognised, each only for a tool the request offered (anything else stays text):

    Hermes / Qwen   text <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call> ... (one or more
                    blocks; the text around them is the content; a last block may lack its closing tag)
    Llama 3 JSON    [<|python_tag|>]{"name": "f", "parameters": {...}} (several joined by ";"), also
                    {"type": "function", "name": "f", "parameters": {...}}
    generic JSON    the whole reply is JSON (bare or in a ``` fence): a call object as above, with "arguments"
                    or "parameters", {"type": "function", "function": {...}}, {"tool_calls": [...]}, or an
                    array of them (the form a reply constrained to tool_call_schema.reply_schema takes)

The parser reads the reply as it streams (`feed`), and a whole reply is parsed by feeding it at once
(`parse_reply`), so the two agree by construction. A reply whose first non-blank text opens JSON (`{`, `[`,
a fence, <|python_tag|>) is held until it ends; otherwise text streams as content at once, except a tail that
might open a <tool_call> tag and blank text (sent when text follows it, dropped before a call and at the end
of a reply with calls). A reply without calls keeps its text exactly. Arguments are
JSON text, written as json.dumps writes them. With parallel_tool_calls false only the first call is kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_JSON_OPENERS = ("{", "[", "```", _PYTHON_TAG)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*(.*?)\s*```$", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as text


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    calls: list[ParsedCall]


class ToolCallParser:
    """One reply's text in, content pieces and calls out (`feed` as text arrives, `finish` at the end)."""

    def __init__(self, tool_names: Iterable[str], parallel_tool_calls: bool = True) -> None:
        self.tool_names = frozenset(tool_names)
        self.parallel = parallel_tool_calls
        self.num_calls = 0
        self._pending = ""  # text not yet decided on
        self._blank = ""  # blank text held until non-blank content follows
        self._mode = "start"  # "start" (nothing but blanks yet), "json" (held to the end) or "text"

    def feed(self, text: str) -> list[str | ParsedCall]:
        self._pending += text
        if self._mode == "start":
            stripped = self._pending.lstrip()
            if not stripped or any(o.startswith(stripped) for o in _JSON_OPENERS if len(stripped) < len(o)):
                return []
            self._mode = "json" if stripped.startswith(_JSON_OPENERS) else "text"
        if self._mode == "json":
            return []
        return self._scan(final=False)

    def finish(self) -> list[str | ParsedCall]:
        if self._mode == "json":
            calls = _json_calls(self._pending.strip(), self.tool_names)
            if calls is not None:
                self._pending = ""
                return self._calls(calls)
        return self._scan(final=True) + ([self._blank] if self._blank and not self.num_calls else [])

    # ---- text with <tool_call> blocks ------------------------------------------------------------
    def _scan(self, final: bool) -> list[str | ParsedCall]:
        out: list[str | ParsedCall] = []
        while self._pending:
            start = self._pending.find(_OPEN)
            if start < 0:
                keep = 0 if final else _partial_suffix(self._pending, _OPEN)
                out += self._content(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                break
            out += self._content(self._pending[:start])
            self._pending = self._pending[start:]
            end = self._pending.find(_CLOSE)
            if end < 0 and not final:
                break
            block = self._pending if end < 0 else self._pending[: end + len(_CLOSE)]
            self._pending = self._pending[len(block) :]
            body = block[len(_OPEN) : len(block) - (len(_CLOSE) if end >= 0 else 0)]
            call = _call(_loads(body.strip()), self.tool_names)
            if call is None:
                out += self._content(block)
            else:
                self._blank = ""
                out += self._calls([call])
        return out

    def _content(self, text: str) -> list[str | ParsedCall]:
        if not text:
            return []
        if not text.strip():
            self._blank += text
            return []
        # Blank text waits for what follows: sent before content, dropped before a call.
        body = text.rstrip()
        out = self._blank + body
        self._blank = text[len(body) :]
        return [out]

    def _calls(self, calls: list[ParsedCall]) -> list[str | ParsedCall]:
        if not self.parallel:
            calls = calls[: max(0, 1 - self.num_calls)]
        self.num_calls += len(calls)
        return list(calls)


def parse_reply(text: str, tool_names: Iterable[str], parallel_tool_calls: bool = True) -> ParsedReply:
    """A whole reply's content (None when it is only calls) and calls."""
    parser = ToolCallParser(tool_names, parallel_tool_calls)
    pieces = parser.feed(text) + parser.finish()
    content = "".join(p for p in pieces if isinstance(p, str))
    calls = [p for p in pieces if isinstance(p, ParsedCall)]
    return ParsedReply(content if content or not calls else None, calls)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (text that may yet become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _loads(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _json_calls(text: str, names: frozenset[str]) -> list[ParsedCall] | None:
    """The calls a reply made of JSON holds (Llama 3 and generic forms), or None when it is not only calls."""
    if text.startswith(_PYTHON_TAG):
        text = text[len(_PYTHON_TAG) :].strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    decoder = json.JSONDecoder()
    calls: list[ParsedCall] = []
    i = 0
    while i < len(text):
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            return None
        found = _calls_in(value, names)
        if not found:
            return None
        calls += found
        while i < len(text) and (text[i].isspace() or text[i] == ";"):
            i += 1
    return calls or None


def _calls_in(value, names: frozenset[str]) -> list[ParsedCall] | None:
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list) and len(value) == 1:
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names) for item in items]
    return calls if calls and all(c is not None for c in calls) else None


def _call(value, names: frozenset[str]) -> ParsedCall | None:
    """A call object in any of the recognised shapes, naming an offered tool; None otherwise."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))
