"""JSON read a character at a time and written out as json.dumps writes it, for text that streams (a tool call's
arguments as the model generates them, salon/gateway/tool_calls.py):

    Lexer       characters in, tokens out as soon as they are known: "{" "}" "[" "]" ":" ","; a string as
                ('"',), then ('s', decoded characters) pieces, then ('e',); ('n', number), ('l', literal)
    JsonValue   checks that tokens make one JSON value, and says when it is complete
    canonical   a token's text as json.dumps(..., ensure_ascii=False) writes it (", " and ": " between members,
                escapes only where JSON needs them, numbers as Python reads them), so the canonical texts of a
                value's tokens joined are json.dumps of the value (a lone surrogate stays an escape)

Anything that is not JSON raises NotJson as soon as the token out of place is read (a number or a literal is
read at the character after it).
"""

from __future__ import annotations

import json
import re

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class NotJson(Exception):
    """The text is not JSON."""


class Lexer:
    """JSON text in, tokens out: one of "{}[]:," ; ('"',) a string opens, ('s', text) decoded characters of it,
    ('e',) it closes; ('n', canonical number); ('l', literal). Whitespace between tokens is skipped."""

    def __init__(self) -> None:
        self.state = "ws"  # ws, str, esc, u, num, lit
        self.buf = ""
        self.high = ""  # a high surrogate waiting for its low half

    def push(self, ch: str) -> list[tuple]:
        state = self.state
        if state == "str":
            if ch == '"':
                self.state = "ws"
                return self._lone() + [("e",)]
            if ch == "\\":
                self.state = "esc"
                return []
            if ch < " ":
                raise NotJson("a control character in a string")
            return self._lone() + [("s", ch)]
        if state == "esc":
            self.state = "str"
            if ch == "u":
                self.state, self.buf = "u", ""
                return []
            plain = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}.get(ch)
            if plain is None:
                raise NotJson("a bad escape")
            return self._lone() + [("s", plain)]
        if state == "u":
            if ch not in "0123456789abcdefABCDEF":
                raise NotJson("a bad \\u escape")
            self.buf += ch
            if len(self.buf) < 4:
                return []
            self.state = "str"
            char = chr(int(self.buf, 16))
            if "\ud800" <= char <= "\udbff":
                out = self._lone()
                self.high = char
                return out
            if "\udc00" <= char <= "\udfff" and self.high:
                pair, self.high = (self.high + char).encode("utf-16", "surrogatepass").decode("utf-16"), ""
                return [("s", pair)]
            return self._lone() + [("s", char)]
        if state == "num":
            if ch in "0123456789+-.eE":
                self.buf += ch
                return []
            self.state = "ws"
            return [self._number()] + self.push(ch)
        if state == "lit":
            if ch.isalpha():
                self.buf += ch
                if len(self.buf) > 5:
                    raise NotJson("an unknown literal")
                return []
            if self.buf not in ("true", "false", "null"):
                raise NotJson("an unknown literal")
            self.state = "ws"
            return [("l", self.buf)] + self.push(ch)
        if ch in " \t\r\n":
            return []
        if ch in "{}[]:,":
            return [ch]
        if ch == '"':
            self.state = "str"
            return [('"',)]
        if ch == "-" or ch.isdigit():
            self.state, self.buf = "num", ch
            return []
        if ch.isalpha():
            self.state, self.buf = "lit", ch
            return []
        raise NotJson(f"{ch!r} is not JSON")

    def _lone(self) -> list[tuple]:
        """A high surrogate not followed by its low half stands alone."""
        if not self.high:
            return []
        high, self.high = self.high, ""
        return [("s", high)]

    def _number(self) -> tuple:
        if not _NUMBER.fullmatch(self.buf):
            raise NotJson("a bad number")
        value = json.loads(self.buf)
        text = json.dumps(value)
        return ("n", text if text not in ("Infinity", "-Infinity") else self.buf)


def canonical(token: tuple | str) -> str:
    """A token's text as json.dumps writes it."""
    if token == ":":
        return ": "
    if token == ",":
        return ", "
    if isinstance(token, str):
        return token
    kind = token[0]
    if kind in ('"', "e"):
        return '"'
    if kind == "s":
        text = json.dumps(token[1], ensure_ascii=False)[1:-1]
        return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return token[1]


class JsonValue:
    """Checks that tokens make one JSON value; `token` returns True when it is complete."""

    def __init__(self) -> None:
        self.stack: list[str] = []  # "{" / "["
        self.state = "value"  # value, value_or_end, key_or_end, key, colon, comma_or_end, string, key_string
        self.done = False

    def token(self, tok) -> bool:
        state = self.state
        if self.done:
            raise NotJson("text after a value")
        if state in ("string", "key_string"):
            if tok[0] == "s":
                return False
            if tok[0] != "e":
                raise NotJson("a string did not close")
            if state == "key_string":
                self.state = "colon"
                return False
            return self._after()
        if state in ("value", "value_or_end"):
            if tok == "]" and state == "value_or_end":
                self.stack.pop()
                return self._after()
            if tok in ("{", "["):
                self.stack.append(tok)
                self.state = "key_or_end" if tok == "{" else "value_or_end"
                return False
            if isinstance(tok, tuple) and tok[0] == '"':
                self.state = "string"
                return False
            if isinstance(tok, tuple) and tok[0] in ("n", "l"):
                return self._after()
            raise NotJson("a value was expected")
        if state in ("key_or_end", "key"):
            if tok == "}" and state == "key_or_end":
                self.stack.pop()
                return self._after()
            if isinstance(tok, tuple) and tok[0] == '"':
                self.state = "key_string"
                return False
            raise NotJson("a key was expected")
        if state == "colon":
            if tok != ":":
                raise NotJson("':' was expected")
            self.state = "value"
            return False
        # comma_or_end
        top = self.stack[-1]
        if tok == ",":
            self.state = "key" if top == "{" else "value"
            return False
        if (tok == "}" and top == "{") or (tok == "]" and top == "["):
            self.stack.pop()
            return self._after()
        raise NotJson("',' or the end of a container was expected")

    def _after(self) -> bool:
        if self.stack:
            self.state = "comma_or_end"
            return False
        self.done = True
        return True
