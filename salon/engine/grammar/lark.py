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
common's, undefined names, terminals that use rules or themselves, rules that can never end (`a: a ~ 2`) or
are only a repetition of themselves (`a: a ~ 0..2`) (xgrammar 0.2.9 crashes compiling these), what
lark_regex.py cannot express.
Bounded: MAX_GRAMMAR_BYTES checked before anything is read, then linear work; groups nest at most
MAX_NESTING deep (lark_reader.py recurses once per level).
"""

from __future__ import annotations

import functools
import re

from salon.common.errors import InvalidArgument
from salon.engine.grammar.constraint import MAX_GRAMMAR_BYTES
from salon.engine.grammar.ebnf import Alt, Expr, Lit, Ref, Repeat, Seq, Token, alt, render
from salon.engine.grammar.lark_reader import Definition, LarkReader, lark_error, lark_tokens

_IGNORE = "__ignore"
_EMPTY = (Token(Lit("")), Lit(""), Seq(()))
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
_QUOTED = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'""")
_COMMENT = re.compile(r"(?:#|//).*")


def is_lark(text: str) -> bool:
    """Whether a grammar is Lark rather than GBNF: no line defines a rule with `::=` (vLLM's test)."""
    return not any("::=" in _COMMENT.sub("", _QUOTED.sub('""', line)) for line in text.split("\n"))


def as_ebnf(text: str) -> str:
    """A grammar constraint's text as xgrammar's EBNF: GBNF as given, Lark converted."""
    return lark_to_ebnf(text) if is_lark(text) else text


def lark_to_ebnf(text: str) -> str:
    """The Lark grammar as xgrammar's EBNF with a `root` rule; InvalidArgument naming the line of a problem."""
    size = len(text.encode())
    if size > MAX_GRAMMAR_BYTES:
        raise InvalidArgument(f"grammar: {size} bytes is more than {MAX_GRAMMAR_BYTES}")
    reader = LarkReader(lark_tokens(text))
    reader.read()
    definitions = dict(reader.definitions)
    library = _common()
    for alias, name, line in reader.imports:
        if name not in library:
            raise lark_error(line, f"common.{name} is not one of the common terminals ({', '.join(library)})")
        if alias in definitions:
            raise lark_error(line, f"{alias} is defined more than once")
        definitions[alias] = Definition(alias, True, library[name].expr, line)
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
        raise lark_error(endless.line, f"the rule {endless.name} can never end (each alternative leads back to it)")
    looped = _repeats_itself(names, every)
    if looped is not None:
        raise lark_error(looped.line, f"the rule {looped.name} is only a repetition of itself")
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
def _common() -> dict[str, Definition]:
    """common.lark's terminals by name; their bodies refer to each other under _COMMON_PREFIX names."""
    reader = LarkReader(lark_tokens(_COMMON), ref_prefix=_COMMON_PREFIX)
    reader.read()
    return dict(reader.definitions)


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


def _check_names(definitions: list[Definition], ignored: list[Expr], every: dict[str, Definition]) -> None:
    """Every name used is defined; terminals use only terminals, and not themselves (as Lark requires)."""
    for d in definitions:
        for ref in _refs(d.expr):
            if ref.name not in every:
                raise lark_error(ref.line, f"{ref.name} is not defined")
            if d.is_terminal and not every[ref.name].is_terminal:
                raise lark_error(ref.line, f"the terminal {d.name} uses the rule {ref.name}")
    for expr in ignored:
        for ref in _refs(expr):
            if ref.name not in every or not every[ref.name].is_terminal:
                raise lark_error(ref.line, f"%ignore takes terminals; {ref.name} is not a defined terminal")
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
                raise lark_error(every[child].line, f"the terminal {child} uses itself (terminals cannot recurse)")
            elif not state.get(child):
                state[child] = 1
                path.append((child, iter([r.name for r in _refs(every[child].expr)])))


def _reachable(roots: list[str], every: dict[str, Definition]) -> list[str]:
    """The definitions the roots use, in the order of the grammar (then of common.lark)."""
    seen = set(roots)
    stack = list(roots)
    while stack:
        for ref in _refs(every[stack.pop()].expr):
            if ref.name not in seen:
                seen.add(ref.name)
                stack.append(ref.name)
    return [name for name in every if name in seen]


def _endless(names: list[str], every: dict[str, Definition]) -> Definition | None:
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


def _repeats_itself(names: list[str], every: dict[str, Definition]) -> Definition | None:
    """The first rule on a cycle of rules that are each nothing but (a repetition of) the next, or None.

    xgrammar 0.2.9 crashes compiling such a cycle when a count is on it (`a: a ~ 0..2`, `a: b ~ 2` with
    `b: a`) even where the rule can end (on the empty text, the only text it can ever match)."""
    nxt: dict[str, str] = {}
    for name in names:
        expr = every[name].expr
        while True:
            if isinstance(expr, Seq):
                items = [i for i in expr.items if i not in _EMPTY]
                if len(items) != 1:
                    break
                expr = items[0]
            elif isinstance(expr, Repeat | Token):
                expr = expr.item
            else:
                break
        if isinstance(expr, Ref) and not every[expr.name].is_terminal:
            nxt[name] = expr.name
    state: dict[str, int] = {}  # 1: on the walk being followed, 2: done
    for name in names:
        walk = []
        while name in nxt and not state.get(name):
            state[name] = 1
            walk.append(name)
            name = nxt[name]
        if state.get(name) == 1:
            return every[name]
        for done in walk:
            state[done] = 2
    return None


def _body(expr: Expr, every: dict[str, Definition], weave: bool) -> Expr:
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
