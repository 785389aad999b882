"""Grammar expressions and their text in xgrammar's EBNF (GBNF), for grammars built from other syntaxes (lark.py).

    Lit("ab")                     "ab"        (JSON-style escapes)
    Chars(((97, 122),), True)     [^a-z]
    Ref("name")                   name
    Seq((a, b))                   a b         (empty: "")
    Alt((a, b))                   a | b
    Repeat(x, 0, 1) / (0, None) / (1, None) / (2, 2) / (2, None) / (2, 5)
                                  x? x* x+ x{2} x{2,} x{2,5}
    Token(x)                      x           (one token of a rule: %ignore text may come before it)

Expressions nest no deeper than their reader allows (lark.py, lark_regex.py bound it), so rendering recurses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_NAMED_ESCAPES = {ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r", ord("\\"): "\\\\"}


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Chars:
    # Inclusive code point ranges.
    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class Ref:
    name: str
    # Where the name was written (error messages only).
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Seq:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Expr, ...]


@dataclass(frozen=True)
class Repeat:
    item: Expr
    min_count: int
    max_count: int | None  # None: unbounded


@dataclass(frozen=True)
class Token:
    item: Expr


Expr = Lit | Chars | Ref | Seq | Alt | Repeat | Token


def seq(items: list[Expr]) -> Expr:
    """Items in a row, adjacent literals joined; one item stands alone."""
    joined: list[Expr] = []
    for item in items:
        if isinstance(item, Lit) and joined and isinstance(joined[-1], Lit):
            joined[-1] = Lit(joined[-1].text + item.text)
        else:
            joined.append(item)
    return joined[0] if len(joined) == 1 else Seq(tuple(joined))


def alt(options: list[Expr]) -> Expr:
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _escape(cp: int, specials: str) -> str:
    if cp in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[cp]
    if chr(cp) in specials:
        return "\\" + chr(cp)
    if chr(cp).isprintable():
        return chr(cp)
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def render(expr: Expr) -> str:
    """The expression as the right-hand side of an EBNF rule."""
    if isinstance(expr, Token):
        return render(expr.item)
    if isinstance(expr, Alt):
        return " | ".join(render(o) for o in expr.options)
    if isinstance(expr, Seq):
        return " ".join(_operand(i, in_seq=True) for i in expr.items) if expr.items else '""'
    if isinstance(expr, Repeat):
        return _operand(expr.item, in_seq=False) + _quantifier(expr.min_count, expr.max_count)
    if isinstance(expr, Lit):
        return '"' + "".join(_escape(ord(c), '"') for c in expr.text) + '"'
    if isinstance(expr, Chars):
        parts = [_escape(lo, "]-^[") + ("" if lo == hi else "-" + _escape(hi, "]-^[")) for lo, hi in expr.ranges]
        return "[" + ("^" if expr.negated else "") + "".join(parts) + "]"
    return expr.name


def _operand(expr: Expr, in_seq: bool) -> str:
    """expr as one item of a sequence (in_seq) or as what a quantifier repeats: parenthesized when it binds looser."""
    while isinstance(expr, Token):
        expr = expr.item
    loose = isinstance(expr, Alt) or (isinstance(expr, Seq) and not in_seq) or (isinstance(expr, Repeat) and not in_seq)
    return f"({render(expr)})" if loose else render(expr)


def _quantifier(min_count: int, max_count: int | None) -> str:
    if (min_count, max_count) == (0, 1):
        return "?"
    if max_count is None:
        return {0: "*", 1: "+"}.get(min_count, f"{{{min_count},}}")
    return f"{{{min_count}}}" if min_count == max_count else f"{{{min_count},{max_count}}}"
