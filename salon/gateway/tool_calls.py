"""A reply's text parsed into OpenAI tool calls as it streams: content, and each call's name then its arguments in
fragments, so a stream and a whole reply agree. Both fronts use it (HTTP's chat completions, gRPC's Generate).

Three forms of a call are recognised, each only for a tool the request offered (anything else stays text):

    Hermes / Qwen   text <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call> ... (one or more
                    blocks; the text around them is the content; a last block may lack its closing tag)
    Llama 3 JSON    [<|python_tag|>]{"name": "f", "parameters": {...}} (several joined by ";"), also
                    {"type": "function", "name": "f", "parameters": {...}}
    generic JSON    the reply opens with JSON (bare or in a ``` fence): a call object as above, with "arguments"
                    or "parameters" (an object, or a string holding one), {"type": "function", "function":
                    {...}}, {"tool_calls": [...]}, or an array of them (the form a reply constrained to
                    salon/common/tool_call_schema.py's reply_schema takes)

How it streams (`feed` as text arrives, `finish` at the end; `parse_reply` feeds a whole reply at once, so the
two agree by construction):
  * Text streams as content at once, except a tail that might open a <tool_call> tag and blank text (sent
    when text follows it, dropped before a call and at the end of a reply with calls). A reply whose first
    non-blank text opens JSON ({, [, a fence, <|python_tag|>) is held until its first call starts.
  * A call starts (CallStart: its index and name) when its arguments start, the name being known (or, with
    the arguments first, when the name is read); its arguments then stream as the model writes them
    (CallArguments fragments), written as json.dumps writes JSON (", " and ": " between members, strings
    unescaped where JSON allows, numbers as Python reads them), so the fragments of a call joined are its
    whole arguments. A call without arguments has "{}".
  * What breaks a call before it starts (a tool not offered, JSON that is no call) is content, as written.
    Once a call has started its fragments stand: a reply cut short leaves its arguments cut short (as
    OpenAI's do), and text that breaks a started call is dropped to the end of its block (or of a JSON
    reply). After complete JSON calls, other text is content again.
  * With parallel_tool_calls false only the first call is kept.
A reply without calls keeps its text exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from salon.gateway.json_stream import JsonValue, Lexer, NotJson, canonical

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_FENCE = "```"
_JSON_OPENERS = ("{", "[", _FENCE, _PYTHON_TAG)
_MAX_NAME_CHARS = 64
_ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class CallStart:
    """A call begins: its index among the reply's calls and the function's name."""

    index: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next fragment of call `index`'s arguments (JSON text)."""

    index: int
    text: str


Piece = str | CallStart | CallArguments


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as text


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    calls: list[ParsedCall]


class _Broken(NotJson):
    """The text is not (or no longer) a call."""


# ---- the shapes of calls ------------------------------------------------------------------------------------
class _Reader:
    """The tokens of one JSON region (a <tool_call> block's body, or a reply that opens with JSON): a sequence
    of values, each a call object, an array of them or {"tool_calls": [...]}; calls go to `sink`. Frames (a
    call array, a call object) stack as the values nest; the top one reads each token."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink
        self.frames: list[_CallArray | _CallObject] = []
        self.value_calls = 0  # calls started in the current top-level value

    @property
    def between_values(self) -> bool:
        return not self.frames

    def token(self, tok) -> None:
        if self.frames:
            self.frames[-1].token(tok)
            return
        self.value_calls = 0
        if tok == "{":
            self.frames.append(_CallObject(self, top=True))
        elif tok == "[":
            self.frames.append(_CallArray(self))
        else:
            raise _Broken("a call was expected")

    def pop(self) -> None:
        """The top frame's value ended: the frame below (a call object whose member it was) goes on."""
        self.frames.pop()
        if self.frames and isinstance(self.frames[-1], _CallObject):
            self.frames[-1].member_done()


class _CallArray:
    def __init__(self, reader: _Reader) -> None:
        self.reader = reader
        self.state = "first"  # first (a call or ]), next (, or ]), call (a call)

    def token(self, tok) -> None:
        if tok == "]" and self.state in ("first", "next"):
            self.reader.pop()
        elif tok == "{" and self.state in ("first", "call"):
            self.state = "next"
            self.reader.frames.append(_CallObject(self.reader, top=False))
        elif tok == "," and self.state == "next":
            self.state = "call"
        else:
            raise _Broken("an array of calls was expected")


class _CallObject:
    """One call object's members: name, arguments / parameters, function (the call nested), tool_calls (a
    wrapper, as the first member of a top-level object); other members are checked and skipped."""

    def __init__(self, reader: _Reader, top: bool) -> None:
        self.reader = reader
        self.top = top
        self.state = "key_or_end"  # key_or_end, key, key_string, colon, value, member, nested, comma_or_end
        self.key = ""
        self.first_key = True
        self.member: _Name | _Skip | _Arguments | None = None  # the reader of a member's value
        self.name: str | None = None
        self.index: int | None = None  # set once the call started
        self.held: list[str] = []  # arguments read before the name
        self.has_arguments = False
        self.nested = False  # the call is a member of this object ("function"), or calls are ("tool_calls")

    def arguments(self, text: str) -> None:
        """The next fragment of the arguments: out once the call started, held until the name is read."""
        if self.index is None and self.name is not None:
            self._start()
        if self.index is None:
            self.held.append(text)
        else:
            self.reader.sink.arguments(self.index, text)

    def _start(self) -> None:
        self.index = self.reader.sink.start(self.name)
        self.reader.value_calls += 1
        if self.held:
            self.reader.sink.arguments(self.index, "".join(self.held))
            self.held = []

    def member_done(self, name: str | None = None) -> None:
        self.member = None
        self.state = "comma_or_end"
        if name is not None:
            if name not in self.reader.sink.names:
                raise _Broken("not an offered tool")
            self.name = name
            if self.has_arguments:
                self._start()

    def token(self, tok) -> None:
        if self.member is not None:
            self.member.token(tok)
            return
        state = self.state
        if state in ("key_or_end", "key"):
            if tok == "}" and state == "key_or_end":
                self._close()
            elif isinstance(tok, tuple) and tok[0] == '"':
                self.state, self.key = "key_string", ""
            else:
                raise _Broken("a key was expected")
        elif state == "key_string":
            if tok[0] == "s":
                self.key = (self.key + tok[1])[:16]  # no key of interest is longer
            else:
                self.state = "colon"
        elif state == "colon":
            if tok != ":":
                raise _Broken("':' was expected")
            self.state = "value"
        elif state == "value":
            self._member(tok)
        elif tok == ",":
            self.state = "key"
        elif tok == "}":
            self._close()
        else:
            raise _Broken("',' or '}' was expected")

    def _member(self, tok) -> None:
        key, first = self.key, self.first_key
        self.first_key = False
        fresh = self.name is None and not self.has_arguments and not self.nested
        if key == "tool_calls" and first and self.top:
            if tok != "[":
                raise _Broken("tool_calls must be an array")
            self.nested, self.state = True, "nested"
            self.reader.frames.append(_CallArray(self.reader))
            return
        if key == "function" and fresh and tok == "{":
            self.nested, self.state = True, "nested"
            self.reader.frames.append(_CallObject(self.reader, top=False))
            return
        if key == "name" and self.name is None and not self.nested:
            self.member = _Name(self)
        elif key in _ARGUMENT_KEYS and not self.has_arguments and not self.nested:
            self.has_arguments = True
            self.member = _Arguments(self)
        else:
            self.member = _Skip(self)
        self.member.token(tok)

    def _close(self) -> None:
        if not self.nested:
            if self.name is None:
                raise _Broken("a call without a name")
            if not self.has_arguments:
                self.arguments("{}")
        self.reader.pop()


class _Name:
    """The function's name: a string of at most 64 characters."""

    def __init__(self, owner: _CallObject) -> None:
        self.owner = owner
        self.text: str | None = None

    def token(self, tok) -> None:
        if self.text is None:
            if not (isinstance(tok, tuple) and tok[0] == '"'):
                raise _Broken("a name must be a string")
            self.text = ""
        elif tok[0] == "s":
            self.text += tok[1]
            if len(self.text) > _MAX_NAME_CHARS:
                raise _Broken("not an offered tool")
        else:
            self.owner.member_done(self.text)


class _Skip:
    """A member value of no interest, checked and dropped."""

    def __init__(self, owner: _CallObject) -> None:
        self.owner = owner
        self.value = JsonValue()

    def token(self, tok) -> None:
        if self.value.token(tok):
            self.owner.member_done()


class _Arguments:
    """The arguments: an object written out as json.dumps writes it, or a string holding one (its characters
    read as JSON in turn)."""

    def __init__(self, owner: _CallObject) -> None:
        self.owner = owner
        self.value = JsonValue()
        self.inner: Lexer | None = None  # the arguments given as a string: its characters' lexer

    def token(self, tok) -> None:
        if self.inner is not None:
            if tok[0] == "s":
                for ch in tok[1]:
                    for inner_tok in self.inner.push(ch):
                        self._emit(inner_tok)
                return
            # The string closed: it held one whole object.
            if not self.value.done or self.inner.state != "ws":
                raise _Broken("the arguments string is not a whole object")
            self.owner.member_done()
            return
        if self.value.state == "value" and not self.value.stack and isinstance(tok, tuple) and tok[0] == '"':
            self.inner = Lexer()
            return
        if self._emit(tok) and self.inner is None:
            self.owner.member_done()

    def _emit(self, tok) -> bool:
        if self.value.state == "value" and not self.value.stack and tok != "{":
            raise _Broken("the arguments must be an object")
        done = self.value.token(tok)
        self.owner.arguments(canonical(tok))
        return done


class _Sink:
    """Where started calls and their arguments go (the parser's output, in order with the content)."""

    def __init__(self, names: frozenset[str], parallel: bool) -> None:
        self.names = names
        self.parallel = parallel
        self.num_calls = 0
        self.out: list[Piece] = []

    def start(self, name: str) -> int:
        index = self.num_calls
        self.num_calls += 1
        if self.parallel or index == 0:
            self.out.append(CallStart(index, name))
        return index

    def arguments(self, index: int, text: str) -> None:
        if not self.parallel and index > 0:
            return
        last = self.out[-1] if self.out else None
        if isinstance(last, CallArguments) and last.index == index:
            self.out[-1] = CallArguments(index, last.text + text)
        else:
            self.out.append(CallArguments(index, text))


# ---- the parser ---------------------------------------------------------------------------------------------
class ToolCallParser:
    """One reply's text in, content pieces and calls out (`feed` as text arrives, `finish` at the end)."""

    def __init__(self, tool_names: Iterable[str], parallel_tool_calls: bool = True) -> None:
        self.sink = _Sink(frozenset(tool_names), parallel_tool_calls)
        self._pending = ""  # text not yet decided on
        self._blank = ""  # blank text held until non-blank content follows
        # start (nothing but blanks yet), text, block (in a <tool_call> block), dead (a block that is text, to
        # its closing tag) or json (a reply that opens with JSON)
        self._mode = "start"
        # The current JSON region (a block's body or a JSON reply): its lexer and reader, its raw text not yet
        # known to be calls, and whether it broke after a call started (its rest is dropped).
        self._lexer = Lexer()
        self._reader = _Reader(self.sink)
        self._raw = ""
        self._broken = False
        self._prefix = ""  # json: a python tag or fence being read
        self._language = False  # json: after an opening fence, its language name

    def feed(self, text: str) -> list[Piece]:
        if self._mode == "start":
            self._pending += text
            stripped = self._pending.lstrip()
            if not stripped or any(o.startswith(stripped) for o in _JSON_OPENERS if len(stripped) < len(o)):
                return []
            text, self._pending = self._pending, ""
            self._mode = "json" if stripped.startswith(_JSON_OPENERS) else "text"
        self._run(text, final=False)
        return self._take()

    def finish(self) -> list[Piece]:
        self._run("", final=True)
        if self._blank and not self.sink.num_calls:
            self.sink.out.append(self._blank)
        self._blank = ""
        return self._take()

    def _take(self) -> list[Piece]:
        out, self.sink.out = self.sink.out, []
        merged: list[Piece] = []
        for piece in out:
            if isinstance(piece, str) and merged and isinstance(merged[-1], str):
                merged[-1] += piece
            else:
                merged.append(piece)
        return merged

    def _run(self, text: str, final: bool) -> None:
        if self._mode == "start":  # the reply ends while undecided: it is text
            text, self._pending, self._mode = self._pending + text, "", "text"
        if self._mode == "json":
            text = self._json(text, final)
        if self._mode != "json":
            self._pending += text
            self._scan(final)

    def _region(self, raw: str) -> None:
        self._lexer, self._reader = Lexer(), _Reader(self.sink)
        self._raw, self._broken = raw, False

    # ---- a reply that opens with JSON ----------------------------------------------------------------
    def _json(self, text: str, final: bool) -> str:
        """Feed a JSON reply; what is left to read as text once it turns out to be text."""
        for i, ch in enumerate(text):
            if self._broken:
                return ""
            self._raw += ch
            if self._reader.between_values and self._lexer.state == "ws":
                between = self._between(ch)
                if between == "text":
                    return self._leave_json(text[i + 1 :])
                if between == "skip":
                    continue
            try:
                for tok in self._lexer.push(ch):
                    self._reader.token(tok)
            except NotJson:
                if self._reader.value_calls:
                    self._broken = True
                    return ""
                return self._leave_json(text[i + 1 :])
            if self._reader.between_values and self._reader.value_calls:
                self._raw = ""
        if final and not self._broken:
            in_value = not self._reader.between_values or self._lexer.state != "ws"
            if not self.sink.num_calls or (in_value and not self._reader.value_calls):
                return self._leave_json("")
        return ""

    def _between(self, ch: str) -> str:
        """What a character between JSON values is: "skip" (blanks, ';', the python tag, a fence and its
        language), "value" (a value opens) or "text"."""
        if self._prefix or ch in "<`":
            self._prefix += ch
            tag = _PYTHON_TAG if self._prefix[0] == "<" else _FENCE
            if not tag.startswith(self._prefix):
                return "text"
            if self._prefix == tag:
                self._prefix = ""
                self._language = tag == _FENCE
            return "skip"
        if self._language and ch.isalpha():
            return "skip"
        self._language = False
        if ch in " \t\r\n;":
            return "skip"
        return "value" if ch in "{[" else "text"

    def _leave_json(self, rest: str) -> str:
        """The JSON is text from where its current value began."""
        raw, self._raw, self._prefix, self._mode = self._raw, "", "", "text"
        return raw + rest

    # ---- text with <tool_call> blocks ----------------------------------------------------------------
    def _scan(self, final: bool) -> None:
        while True:
            if self._mode == "block":
                if not self._block(final):
                    return
                continue
            if self._mode == "dead":
                if not self._dead(final):
                    return
                continue
            if not self._pending:
                return
            start = self._pending.find(_OPEN)
            if start < 0:
                keep = 0 if final else _partial_suffix(self._pending, _OPEN)
                self._content(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                return
            self._content(self._pending[:start])
            self._pending = self._pending[start + len(_OPEN) :]
            self._mode = "block"
            self._region(_OPEN)

    def _block(self, final: bool) -> bool:
        """Feed the open block what has arrived of its body; False when it needs more text."""
        end = self._pending.find(_CLOSE)
        body_end = end if end >= 0 else len(self._pending) - (0 if final else _partial_suffix(self._pending, _CLOSE))
        body, self._pending = self._pending[:body_end], self._pending[body_end:]
        for j, ch in enumerate(body):
            if self._broken:
                break
            self._raw += ch
            try:
                if self._reader.between_values and self._reader.value_calls and self._lexer.state == "ws":
                    if ch not in " \t\r\n":
                        raise _Broken("text after the call")
                    continue
                for tok in self._lexer.push(ch):
                    self._reader.token(tok)
            except NotJson:
                if self._reader.value_calls:
                    self._broken = True
                    continue
                # No call in this block: it is content, to its closing tag.
                self._content(self._raw + body[j + 1 :])
                self._raw, self._mode = "", "dead"
                return True
        if end < 0 and not final:
            return False
        if end >= 0:
            self._pending = self._pending[len(_CLOSE) :]
            self._raw += _CLOSE
        if self._reader.value_calls:
            self._blank = ""
        else:
            self._content(self._raw)
        self._raw, self._mode = "", "text"
        return True

    def _dead(self, final: bool) -> bool:
        """Content to the block's closing tag; False when it needs more text."""
        close = self._pending.find(_CLOSE)
        if close >= 0:
            self._content(self._pending[: close + len(_CLOSE)])
            self._pending, self._mode = self._pending[close + len(_CLOSE) :], "text"
            return True
        keep = 0 if final else _partial_suffix(self._pending, _CLOSE)
        self._content(self._pending[: len(self._pending) - keep])
        self._pending = self._pending[len(self._pending) - keep :]
        return False

    def _content(self, text: str) -> None:
        if not text:
            return
        if not text.strip():
            self._blank += text
            return
        # Blank text waits for what follows: sent before content, dropped before a call.
        body = text.rstrip()
        self.sink.out.append(self._blank + body)
        self._blank = text[len(body) :]


def new_call_id() -> str:
    """A call's id, as OpenAI writes them."""
    return "call_" + uuid.uuid4().hex[:24]


def parse_reply(text: str, tool_names: Iterable[str], parallel_tool_calls: bool = True) -> ParsedReply:
    """A whole reply's content (None when it is only calls) and calls."""
    parser = ToolCallParser(tool_names, parallel_tool_calls)
    return assemble(parser.feed(text) + parser.finish())


def assemble(pieces: list[Piece]) -> ParsedReply:
    """The reply that streamed pieces make."""
    content = "".join(p for p in pieces if isinstance(p, str))
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for p in pieces:
        if isinstance(p, CallStart):
            names[p.index] = p.name
            arguments[p.index] = []
        elif isinstance(p, CallArguments):
            arguments[p.index].append(p.text)
    calls = [ParsedCall(names[i], "".join(arguments[i])) for i in sorted(names)]
    return ParsedReply(content if content or not calls else None, calls)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (text that may yet become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
