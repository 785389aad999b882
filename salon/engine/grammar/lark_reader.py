"""Lark grammar text read into definitions (lark.py turns them into EBNF): statements, %import and %ignore.

A tokenizer (one regex, linear) then a recursive descent reader that goes one level deeper per nested group, at
most MAX_NESTING; everything else is loops. Errors are InvalidArgument naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from salon.common.errors import InvalidArgument
from salon.engine.grammar.ebnf import Chars, Expr, Lit, Ref, Repeat, Seq, Token, alt, seq
from salon.engine.grammar.lark_regex import MAX_REPEAT_COUNT, char_expr, regex_expr

MAX_NESTING = 32

_TOKEN = re.compile(
    r"""(?P<space>[ \t\f\r]+|\\\r?\n)
    |(?P<comment>(?://|\#)[^\n]*)
    |(?P<newline>\n)
    |(?P<string>"(?:[^"\\\n]|\\.)*"i?|'(?:[^'\\\n]|\\.)*'i?)
    |(?P<regexp>/(?:[^/\\\n]|\\.)+/[a-z]*)
    |(?P<directive>%[a-z]*)
    |(?P<number>-?[0-9]+)
    |(?P<name>[A-Za-z_][A-Za-z_0-9]*)
    |(?P<op>\.\.|->|[:|()\[\]?*+~,{}.!])""",
    re.X,
)
_RULE_NAME = re.compile(r"_?[a-z][_a-z0-9]*")
_TERMINAL_NAME = re.compile(r"_?[A-Z][_A-Z0-9]*")
_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "b": "\b", "0": "\0"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


@dataclass(frozen=True)
class LarkToken:
    kind: str
    value: str
    line: int


@dataclass(frozen=True)
class Definition:
    """A rule or a terminal (is_terminal: an UPPERCASE name), its body, and the line that defines it."""

    name: str
    is_terminal: bool
    expr: Expr
    line: int


def lark_error(line: int, what: str) -> InvalidArgument:
    return InvalidArgument(f"grammar: Lark line {line}: {what}")


def is_terminal_name(name: str) -> bool:
    return _TERMINAL_NAME.fullmatch(name) is not None


def lark_tokens(text: str) -> list[LarkToken]:
    """The grammar's tokens; a newline token ends each statement, except before a continuation line's `|`."""
    tokens: list[LarkToken] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise lark_error(line, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind == "newline":
            if tokens and tokens[-1].kind != "newline":
                tokens.append(LarkToken("newline", "\n", line))
        elif kind not in ("space", "comment"):
            if kind == "op" and m.group() == "|" and tokens and tokens[-1].kind == "newline":
                tokens.pop()
            tokens.append(LarkToken(kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    tokens.append(LarkToken("end", "", line))
    return tokens


def _describe(tok: LarkToken) -> str:
    return {"newline": "the end of the line", "end": "the end of the grammar"}.get(tok.kind, repr(tok.value))


class LarkReader:
    """Statements: definitions, %import and %ignore. Recursive descent, one level per nested group."""

    def __init__(self, tokens: list[LarkToken], ref_prefix: str = "") -> None:
        self.tokens = tokens
        self.i = 0
        self.ref_prefix = ref_prefix
        self.definitions: dict[str, Definition] = {}
        self.imports: list[tuple[str, str, int]] = []  # (name here, common name, line)
        self.ignored: list[Expr] = []

    def peek(self) -> LarkToken:
        return self.tokens[self.i]

    def next(self) -> LarkToken:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, op: str) -> bool:
        tok = self.tokens[self.i]
        return tok.kind == "op" and tok.value == op

    def expect(self, op: str, after: str) -> None:
        if not self.at(op):
            tok = self.peek()
            raise lark_error(tok.line, f"expected {op!r} {after}, got {_describe(tok)}")
        self.i += 1

    def read(self) -> None:
        while self.peek().kind != "end":
            if self.peek().kind == "newline":
                self.i += 1
                continue
            if self.peek().kind == "directive":
                self.directive()
            else:
                self.definition()
            tok = self.peek()
            if tok.kind not in ("newline", "end"):
                raise lark_error(tok.line, f"unexpected {_describe(tok)}")

    def definition(self) -> None:
        modifiers = 0
        while self.at("?") or self.at("!"):
            self.i += 1
            modifiers += 1
        tok = self.next()
        if tok.kind != "name":
            raise lark_error(tok.line, f"expected a rule or terminal definition, got {_describe(tok)}")
        name = self.checked_name(tok)
        if modifiers and is_terminal_name(name):
            raise lark_error(tok.line, f"`?` and `!` apply to rules, not to the terminal {name}")
        if self.at("{"):
            raise lark_error(tok.line, "templates (name{...}) are not supported")
        if self.at("."):
            self.i += 1
            if self.next().kind != "number":
                raise lark_error(tok.line, f"expected a priority number after {name}.")
        self.expect(":", f"after {name}")
        if name in self.definitions:
            raise lark_error(tok.line, f"{name} is defined more than once")
        self.definitions[name] = Definition(name, is_terminal_name(name), self.expansions(0), tok.line)

    def directive(self) -> None:
        tok = self.next()
        if tok.value == "%ignore":
            self.ignored.append(self.expansions(1))
        elif tok.value == "%import":
            self.import_()
        elif tok.value in ("%declare", "%override", "%extend"):
            raise lark_error(tok.line, f"{tok.value} is not supported")
        else:
            raise lark_error(tok.line, f"unknown directive {tok.value!r} (%import and %ignore are supported)")

    def import_(self) -> None:
        module = self.next()
        if module.kind != "name" or module.value != "common" or not (self.at(".") or self.at("(")):
            raise lark_error(module.line, "only the common terminals can be imported (%import common.NAME)")
        if self.at("."):
            self.i += 1
            name = self.import_name()
            alias = name
            if self.at("->"):
                self.i += 1
                alias = self.import_name()
            self.imports.append((alias, name, module.line))
            return
        self.i += 1
        while True:
            self.imports.append((name := self.import_name(), name, module.line))
            if self.at(")"):
                self.i += 1
                return
            self.expect(",", "between imported names")

    def import_name(self) -> str:
        tok = self.next()
        if tok.kind != "name" or not is_terminal_name(tok.value):
            raise lark_error(tok.line, f"expected a terminal name to import, got {_describe(tok)}")
        return tok.value

    def checked_name(self, tok: LarkToken) -> str:
        if not (_RULE_NAME.fullmatch(tok.value) or _TERMINAL_NAME.fullmatch(tok.value)):
            raise lark_error(tok.line, f"{tok.value!r} is not a Lark name (rules are lowercase, terminals UPPERCASE)")
        return tok.value

    def expansions(self, depth: int) -> Expr:
        """Alternatives; an alias (`-> name`) may end each one at the top of a definition (depth 0)."""
        if depth > MAX_NESTING:
            raise lark_error(self.peek().line, f"groups nested deeper than {MAX_NESTING}")
        options = [self.expansion(depth)]
        while self.at("|"):
            self.i += 1
            options.append(self.expansion(depth))
        return alt(options)

    def expansion(self, depth: int) -> Expr:
        items: list[Expr] = []
        while True:
            tok = self.peek()
            if tok.kind in ("newline", "end") or (tok.kind == "op" and tok.value in "|)]"):
                break
            if tok.kind == "op" and tok.value == "->":
                if depth:
                    raise lark_error(tok.line, "an alias (->) may only end an alternative of a definition")
                self.i += 1
                if self.next().kind != "name":
                    raise lark_error(tok.line, "expected a name after ->")
                break
            items.append(self.item(depth))
        return seq(items) if items else Seq(())

    def item(self, depth: int) -> Expr:
        atom = self.atom(depth)
        tok = self.peek()
        if tok.kind != "op" or tok.value not in "?*+~":
            return atom
        self.i += 1
        if tok.value != "~":
            low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[tok.value]
            return Repeat(atom, low, high)
        low = high = self.count(tok)
        if self.at(".."):
            self.i += 1
            high = self.count(tok)
        if high < low:
            raise lark_error(tok.line, f"~ {low}..{high}: the range is empty")
        return Repeat(atom, low, high)

    def count(self, after: LarkToken) -> int:
        tok = self.next()
        if tok.kind != "number" or int(tok.value) < 0:
            raise lark_error(after.line, f"expected a count after ~, got {_describe(tok)}")
        if int(tok.value) > MAX_REPEAT_COUNT:
            raise lark_error(after.line, f"~ {tok.value}: more than {MAX_REPEAT_COUNT}")
        return int(tok.value)

    def atom(self, depth: int) -> Expr:
        tok = self.next()
        if tok.kind == "op" and tok.value in "([":
            inner = self.expansions(depth + 1)
            self.expect(")" if tok.value == "(" else "]", "to close the group")
            return Repeat(inner, 0, 1) if tok.value == "[" else inner
        if tok.kind == "string":
            text, ignore_case = _string_value(tok)
            if self.at(".."):
                self.i += 1
                end = self.next()
                if end.kind != "string":
                    raise lark_error(tok.line, f"expected a string after .., got {_describe(end)}")
                return Token(_char_range(text, _string_value(end)[0], tok.line))
            return Token(seq([char_expr(c, True) for c in text]) if ignore_case and text else Lit(text))
        if tok.kind == "regexp":
            end = tok.value.rindex("/")
            try:
                return Token(regex_expr(tok.value[1:end], tok.value[end + 1 :]))
            except ValueError as exc:
                raise lark_error(tok.line, str(exc)) from None
        if tok.kind == "name":
            name = self.checked_name(tok)
            if self.at("{"):
                raise lark_error(tok.line, "templates (name{...}) are not supported")
            return Ref(self.ref_prefix + name, tok.line)
        raise lark_error(tok.line, f"unexpected {_describe(tok)}")


def _string_value(tok: LarkToken) -> tuple[str, bool]:
    """A string literal's text and whether it has the i flag; escapes as in Python."""
    raw = tok.value
    ignore_case = raw.endswith("i")
    body = raw[1 : -2 if ignore_case else -1]
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        i += 1
        if c != "\\":
            out.append(c)
            continue
        e = body[i]
        i += 1
        if e in "\\\"'":
            out.append(e)
        elif e in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[e])
        elif e in _HEX_DIGITS:
            digits = body[i : i + _HEX_DIGITS[e]]
            i += len(digits)
            cp = int(digits, 16) if re.fullmatch(r"[0-9a-fA-F]+", digits) else -1
            if len(digits) != _HEX_DIGITS[e] or not (0 <= cp <= 0x10FFFF) or 0xD800 <= cp < 0xE000:
                raise lark_error(tok.line, f"\\{e}{digits} in {raw} is not a character")
            out.append(chr(cp))
        else:
            raise lark_error(tok.line, f"unknown escape \\{e} in {raw}")
    return "".join(out), ignore_case


def _char_range(first: str, last: str, line: int) -> Expr:
    if len(first) != 1 or len(last) != 1:
        raise lark_error(line, f"a range is between single characters, not {first!r}..{last!r}")
    if ord(last) < ord(first):
        raise lark_error(line, f"the range {first!r}..{last!r} is empty")
    return Chars(((ord(first), ord(last)),))
