"""Lark grammars (lark-parser.readthedocs.io/en/latest/grammar.html) as xgrammar's EBNF, which the compiler takes.

A grammar constraint is Lark when no line of it writes `::=` outside a comment or a string literal (the test
vLLM applies to the same field); it is converted here, then compiled like GBNF. The grammar is read as a
context-free grammar: a terminal is part of the grammar, not a separate lexer's token, so the texts it admits
are those Lark's Earley parser accepts with lexer="dynamic_complete" (every way of splitting into tokens).

    %import common.INT                   root ::= start
    start: "move " DIR " " INT           start ::= "move " DIR " " INT
    DIR: "north"i | "south"i             DIR ::= [Nn] [Oo] [Rr] [Tt] [Hh] | [Ss] [Oo] [Uu] [Tt] [Hh]
                                         INT ::= __common_DIGIT+
                                         __common_DIGIT ::= [0-9]

Read: rules (lowercase, `?` and `!` prefixes, `_` names) and terminals (UPPERCASE), priorities (ignored),
"literals" with the i flag, /regex/ terminals (lark_regex.py), "a".."z" ranges, alternatives (`|` may start a
continuation line), groups, [optional], ? * +, `~ n` and `~ n..m` counts, aliases (ignored), // and #
comments, `%import common.X [-> Y]` and `%import common (X, Y)` for the terminals of Lark's common.lark
below. The rule `start` is the grammar's root; without one, the first rule is (as vLLM does).

%ignore is woven in: text matching an ignored terminal may come before each token of a rule and at the end
of the reply (`__ignore`, one optional run per gap), which is where Lark's lexer skips it. Note that a small
model may then fill its budget with whitespace.

Refused, InvalidArgument naming the line: templates, %declare, %override, %extend, imports other than
common's, undefined names, terminals that use rules or themselves, rules that can never end (`a: a ~ 2`:
xgrammar 0.2.9 crashes compiling some), what lark_regex.py cannot express.
Bounded: MAX_GRAMMAR_BYTES checked before anything is read, then linear work; groups nest at most
MAX_NESTING deep (the reader recurses once per level).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from salon.common.errors import InvalidArgument
from salon.engine.grammar.constraint import MAX_GRAMMAR_BYTES
from salon.engine.grammar.ebnf import Alt, Chars, Expr, Lit, Ref, Repeat, Seq, Token, alt, render, seq
from salon.engine.grammar.lark_regex import MAX_REPEAT_COUNT, char_expr, regex_expr

MAX_NESTING = 32
_IGNORE = "__ignore"
_COMMON_PREFIX = "__common_"

# Lark's common.lark, with its lookbehind and lazy terminals (ESCAPED_STRING, C_COMMENT) written as grammar.
_COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: "\"" (/[^"\\\n]/ | "\\" /[^\n]/)* "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" (/[^*]/ | /\*+[^*\/]/)* /\*+\//
SQL_COMMENT: /--[^\n]*/
"""

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
_QUOTED = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'""")
_COMMENT = re.compile(r"(?:#|//).*")
_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "b": "\b", "0": "\0"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


def is_lark(text: str) -> bool:
    """Whether a grammar is Lark rather than GBNF: no line defines a rule with `::=` (vLLM's test)."""
    return not any("::=" in _COMMENT.sub("", _QUOTED.sub('""', line)) for line in text.split("\n"))


def as_ebnf(text: str) -> str:
    """A grammar constraint's text as xgrammar's EBNF: GBNF as given, Lark converted."""
    return lark_to_ebnf(text) if is_lark(text) else text


@dataclass(frozen=True)
class _Token:
    kind: str
    value: str
    line: int


@dataclass(frozen=True)
class _Definition:
    name: str
    is_terminal: bool
    expr: Expr
    line: int


def _error(line: int, what: str) -> InvalidArgument:
    return InvalidArgument(f"grammar: Lark line {line}: {what}")


def _is_terminal(name: str) -> bool:
    return _TERMINAL_NAME.fullmatch(name) is not None


def lark_to_ebnf(text: str) -> str:
    """The Lark grammar as xgrammar's EBNF with a `root` rule; InvalidArgument naming the line of a problem."""
    size = len(text.encode())
    if size > MAX_GRAMMAR_BYTES:
        raise InvalidArgument(f"grammar: {size} bytes is more than {MAX_GRAMMAR_BYTES}")
    reader = _Reader(_tokens(text))
    reader.read()
    definitions = dict(reader.definitions)
    library = _common()
    for alias, name, line in reader.imports:
        if name not in library:
            raise _error(line, f"common.{name} is not one of the common terminals ({', '.join(library)})")
        if alias in definitions:
            raise _error(line, f"{alias} is defined more than once")
        definitions[alias] = _Definition(alias, True, library[name].expr, line)
    rules = [d for d in definitions.values() if not d.is_terminal]
    if not rules:
        raise InvalidArgument("grammar: Lark: no rule (a Lark grammar needs a `start` rule)")
    start = "start" if "start" in definitions else rules[0].name
    every = definitions | {_COMMON_PREFIX + name: d for name, d in library.items()}
    _check_names(list(definitions.values()), reader.ignored, every)
    weave = bool(reader.ignored)
    names = _reachable([start, *(r.name for e in reader.ignored for r in _refs(e))], every)
    endless = _endless(names, every)
    if endless is not None:
        raise _error(endless.line, f"the rule {endless.name} can never end (each alternative leads back to it)")
    lines = [f"root ::= {render(Seq((Ref(_out(start)), Ref(_IGNORE))) if weave else Ref(_out(start)))}"]
    for name in names:
        d = every[name]
        lines.append(f"{_out(name)} ::= {render(_body(d.expr, every, weave and not d.is_terminal))}")
    if weave:
        lines.append(f"{_IGNORE} ::= {render(Repeat(alt(reader.ignored), 0, None))}")
    return "\n".join(lines) + "\n"


def _out(name: str) -> str:
    """A Lark name in the EBNF: `root` is the EBNF's start, so a Lark rule of that name is renamed."""
    return "__root" if name == "root" else name


@functools.cache
def _common() -> dict[str, _Definition]:
    """common.lark's terminals by name; their bodies refer to each other under _COMMON_PREFIX names."""
    reader = _Reader(_tokens(_COMMON), ref_prefix=_COMMON_PREFIX)
    reader.read()
    return dict(reader.definitions)


def _tokens(text: str) -> list[_Token]:
    """The grammar's tokens; a newline token ends each statement, except before a continuation line's `|`."""
    tokens: list[_Token] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _error(line, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind == "newline":
            if tokens and tokens[-1].kind != "newline":
                tokens.append(_Token("newline", "\n", line))
        elif kind not in ("space", "comment"):
            if kind == "op" and m.group() == "|" and tokens and tokens[-1].kind == "newline":
                tokens.pop()
            tokens.append(_Token(kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    tokens.append(_Token("end", "", line))
    return tokens


def _describe(tok: _Token) -> str:
    return {"newline": "the end of the line", "end": "the end of the grammar"}.get(tok.kind, repr(tok.value))


class _Reader:
    """Statements: definitions, %import and %ignore. Recursive descent, one level per nested group."""

    def __init__(self, tokens: list[_Token], ref_prefix: str = "") -> None:
        self.tokens = tokens
        self.i = 0
        self.ref_prefix = ref_prefix
        self.definitions: dict[str, _Definition] = {}
        self.imports: list[tuple[str, str, int]] = []  # (name here, common name, line)
        self.ignored: list[Expr] = []

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def next(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, op: str) -> bool:
        tok = self.tokens[self.i]
        return tok.kind == "op" and tok.value == op

    def expect(self, op: str, after: str) -> None:
        if not self.at(op):
            tok = self.peek()
            raise _error(tok.line, f"expected {op!r} {after}, got {_describe(tok)}")
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
                raise _error(tok.line, f"unexpected {_describe(tok)}")

    def definition(self) -> None:
        modifiers = 0
        while self.at("?") or self.at("!"):
            self.i += 1
            modifiers += 1
        tok = self.next()
        if tok.kind != "name":
            raise _error(tok.line, f"expected a rule or terminal definition, got {_describe(tok)}")
        name = self.checked_name(tok)
        if modifiers and _is_terminal(name):
            raise _error(tok.line, f"`?` and `!` apply to rules, not to the terminal {name}")
        if self.at("{"):
            raise _error(tok.line, "templates (name{...}) are not supported")
        if self.at("."):
            self.i += 1
            if self.next().kind != "number":
                raise _error(tok.line, f"expected a priority number after {name}.")
        self.expect(":", f"after {name}")
        if name in self.definitions:
            raise _error(tok.line, f"{name} is defined more than once")
        self.definitions[name] = _Definition(name, _is_terminal(name), self.expansions(0), tok.line)

    def directive(self) -> None:
        tok = self.next()
        if tok.value == "%ignore":
            self.ignored.append(self.expansions(1))
        elif tok.value == "%import":
            self.import_()
        elif tok.value in ("%declare", "%override", "%extend"):
            raise _error(tok.line, f"{tok.value} is not supported")
        else:
            raise _error(tok.line, f"unknown directive {tok.value!r} (%import and %ignore are supported)")

    def import_(self) -> None:
        module = self.next()
        if module.kind != "name" or module.value != "common" or not (self.at(".") or self.at("(")):
            raise _error(module.line, "only the common terminals can be imported (%import common.NAME)")
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
        if tok.kind != "name" or not _is_terminal(tok.value):
            raise _error(tok.line, f"expected a terminal name to import, got {_describe(tok)}")
        return tok.value

    def checked_name(self, tok: _Token) -> str:
        if not (_RULE_NAME.fullmatch(tok.value) or _TERMINAL_NAME.fullmatch(tok.value)):
            raise _error(tok.line, f"{tok.value!r} is not a Lark name (rules are lowercase, terminals UPPERCASE)")
        return tok.value

    def expansions(self, depth: int) -> Expr:
        """Alternatives; an alias (`-> name`) may end each one at the top of a definition (depth 0)."""
        if depth > MAX_NESTING:
            raise _error(self.peek().line, f"groups nested deeper than {MAX_NESTING}")
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
                    raise _error(tok.line, "an alias (->) may only end an alternative of a definition")
                self.i += 1
                if self.next().kind != "name":
                    raise _error(tok.line, "expected a name after ->")
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
            raise _error(tok.line, f"~ {low}..{high}: the range is empty")
        return Repeat(atom, low, high)

    def count(self, after: _Token) -> int:
        tok = self.next()
        if tok.kind != "number" or int(tok.value) < 0:
            raise _error(after.line, f"expected a count after ~, got {_describe(tok)}")
        if int(tok.value) > MAX_REPEAT_COUNT:
            raise _error(after.line, f"~ {tok.value}: more than {MAX_REPEAT_COUNT}")
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
                    raise _error(tok.line, f"expected a string after .., got {_describe(end)}")
                return Token(_char_range(text, _string_value(end)[0], tok.line))
            return Token(seq([char_expr(c, True) for c in text]) if ignore_case and text else Lit(text))
        if tok.kind == "regexp":
            end = tok.value.rindex("/")
            try:
                return Token(regex_expr(tok.value[1:end], tok.value[end + 1 :]))
            except ValueError as exc:
                raise _error(tok.line, str(exc)) from None
        if tok.kind == "name":
            name = self.checked_name(tok)
            if self.at("{"):
                raise _error(tok.line, "templates (name{...}) are not supported")
            return Ref(self.ref_prefix + name, tok.line)
        raise _error(tok.line, f"unexpected {_describe(tok)}")


def _string_value(tok: _Token) -> tuple[str, bool]:
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
                raise _error(tok.line, f"\\{e}{digits} in {raw} is not a character")
            out.append(chr(cp))
        else:
            raise _error(tok.line, f"unknown escape \\{e} in {raw}")
    return "".join(out), ignore_case


def _char_range(first: str, last: str, line: int) -> Expr:
    if len(first) != 1 or len(last) != 1:
        raise _error(line, f"a range is between single characters, not {first!r}..{last!r}")
    if ord(last) < ord(first):
        raise _error(line, f"the range {first!r}..{last!r} is empty")
    return Chars(((ord(first), ord(last)),))


def _refs(expr: Expr):
    """Every Ref in the expression (iteratively)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Ref):
            yield e
        elif isinstance(e, Seq):
            stack.extend(reversed(e.items))
        elif isinstance(e, Alt):
            stack.extend(reversed(e.options))
        elif isinstance(e, Repeat | Token):
            stack.append(e.item)


def _check_names(definitions: list[_Definition], ignored: list[Expr], every: dict[str, _Definition]) -> None:
    """Every name used is defined; terminals use only terminals, and not themselves (as Lark requires)."""
    for d in definitions:
        for ref in _refs(d.expr):
            if ref.name not in every:
                raise _error(ref.line, f"{ref.name} is not defined")
            if d.is_terminal and not every[ref.name].is_terminal:
                raise _error(ref.line, f"the terminal {d.name} uses the rule {ref.name}")
    for expr in ignored:
        for ref in _refs(expr):
            if ref.name not in every or not every[ref.name].is_terminal:
                raise _error(ref.line, f"%ignore takes terminals; {ref.name} is not a defined terminal")
    # Terminal cycles: depth-first, iteratively (0 unseen, 1 on the path, 2 done).
    state: dict[str, int] = {}
    for d in definitions:
        if not d.is_terminal or state.get(d.name):
            continue
        state[d.name] = 1
        path = [(d.name, iter([r.name for r in _refs(every[d.name].expr)]))]
        while path:
            name, children = path[-1]
            child = next(children, None)
            if child is None:
                state[name] = 2
                path.pop()
            elif state.get(child) == 1:
                raise _error(every[child].line, f"the terminal {child} uses itself (terminals cannot recurse)")
            elif not state.get(child):
                state[child] = 1
                path.append((child, iter([r.name for r in _refs(every[child].expr)])))


def _reachable(roots: list[str], every: dict[str, _Definition]) -> list[str]:
    """The definitions the roots use, in the order of the grammar (then of common.lark)."""
    seen = set(roots)
    stack = list(roots)
    while stack:
        for ref in _refs(every[stack.pop()].expr):
            if ref.name not in seen:
                seen.add(ref.name)
                stack.append(ref.name)
    return [name for name in every if name in seen]


def _endless(names: list[str], every: dict[str, _Definition]) -> _Definition | None:
    """The first definition that derives no finite text, or None. xgrammar 0.2.9 crashes compiling some of
    them (`a: a ~ 2`), and none can ever end a reply. Linear: each part of each body is one node that is
    productive once all (a sequence) or any (an alternative, a rule) of its parts are, propagated once."""
    needs: list[int] = []  # per node: parts not yet known productive (what it takes: all, or 1 for any)
    parent: list[int] = []  # per node: the node it is a part of (-1: a rule's own node)
    rule_nodes: dict[str, int] = {}
    refs_to: dict[str, list[int]] = {}  # rule name -> the nodes that refer to it
    productive: list[int] = []

    def node(num_needed: int, of: int) -> int:
        needs.append(num_needed)
        parent.append(of)
        if num_needed == 0:
            productive.append(len(needs) - 1)
        return len(needs) - 1

    for name in names:
        rule_nodes[name] = node(1, -1)
        stack: list[tuple[Expr, int]] = [(every[name].expr, rule_nodes[name])]
        while stack:
            expr, of = stack.pop()
            if isinstance(expr, Seq):
                n = node(len(expr.items), of)
                stack.extend((item, n) for item in expr.items)
            elif isinstance(expr, Alt):
                n = node(1, of)
                stack.extend((option, n) for option in expr.options)
            elif isinstance(expr, Repeat) and expr.min_count > 0:
                stack.append((expr.item, node(1, of)))
            elif isinstance(expr, Ref):
                refs_to.setdefault(expr.name, []).append(node(1, of))
            else:  # a token, a literal, a class, an optional repeat
                node(0, of)
    names_of = {n: name for name, n in rule_nodes.items()}
    while productive:
        n = productive.pop()
        for up in refs_to.get(names_of[n], ()) if n in names_of else (parent[n],):
            if needs[up] > 0:
                needs[up] -= 1
                if needs[up] == 0:
                    productive.append(up)
    return next((every[name] for name in names if needs[rule_nodes[name]] > 0), None)


def _body(expr: Expr, every: dict[str, _Definition], weave: bool) -> Expr:
    """A definition's body as written out: a rule named `root` renamed (_out); with weave, the ignored text
    allowed before each token (a terminal or a literal, regex or range of a rule)."""
    if isinstance(expr, Ref):
        ref = Ref(_out(expr.name))
        return Seq((Ref(_IGNORE), ref)) if weave and every[expr.name].is_terminal else ref
    if isinstance(expr, Token):
        return Seq((Ref(_IGNORE), expr)) if weave else expr
    if isinstance(expr, Seq):
        return Seq(tuple(_body(i, every, weave) for i in expr.items))
    if isinstance(expr, Repeat):
        return Repeat(_body(expr.item, every, weave), expr.min_count, expr.max_count)
    if isinstance(expr, Alt):
        return Alt(tuple(_body(o, every, weave) for o in expr.options))
    return expr
