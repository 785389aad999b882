"""A Lark /regex/ terminal as a grammar expression (ebnf.py): the regular part of Python's syntax.

Read: literals and escapes (\\n \\t \\xHH \\uHHHH ...), `.`, classes `[a-z_]` `[^"\\\\]`, \\d \\w \\s (ASCII:
[0-9], [0-9A-Za-z_], [ \\t\\n\\r\\f\\v]) and their negations, groups `(...)` `(?:...)` `(?P<name>...)`,
alternation, and the quantifiers ? * + {m} {m,} {,n} {m,n} (lazy ones read as greedy: a terminal's language
is the same). Flags: i (ASCII letters match either case), s (`.` matches a newline too), m and u (nothing to
change). Refused with ValueError naming what: anchors (^ $ \\b \\A \\Z), lookaround, back-references,
possessive quantifiers, inline flags, \\D \\W \\S inside a class, counts above MAX_REPEAT_COUNT, groups
nested deeper than MAX_NESTING.
"""

from __future__ import annotations

import re

from salon.engine.grammar.ebnf import Chars, Expr, Lit, Repeat, alt, seq

MAX_NESTING = 32
MAX_REPEAT_COUNT = 10_000

_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20))
_CLASS_ESCAPES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_COUNTS = re.compile(r"\{(\d*)(,?)(\d*)\}")
_ANY_BUT_NEWLINE = Chars(((0x0A, 0x0A),), negated=True)
_ANY = Chars(((0, 0x10FFFF),))


def regex_expr(pattern: str, flags: str = "") -> Expr:
    """The expression matching exactly the strings the pattern fully matches; ValueError naming what it can't."""
    unknown = set(flags) - set("imsu")
    if unknown:
        raise ValueError(f"regex flag {''.join(sorted(unknown))!r} is not supported (i, s, m, u are)")
    return _RegexReader(pattern, ignore_case="i" in flags, dot_all="s" in flags).read()


def fold_case(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The ranges with the other case of every ASCII letter in them added."""
    folded = list(ranges)
    for lo, hi in ranges:
        for start, other in ((0x41, 0x61), (0x61, 0x41)):  # A-Z <-> a-z
            a, b = max(lo, start), min(hi, start + 25)
            if a <= b:
                folded.append((a - start + other, b - start + other))
    return tuple(folded)


def char_expr(c: str, ignore_case: bool) -> Expr:
    """One character, either case of an ASCII letter when ignore_case."""
    if ignore_case and c.isascii() and c.isalpha():
        return Chars(((ord(c.upper()), ord(c.upper())), (ord(c.lower()), ord(c.lower()))))
    return Lit(c)


class _RegexReader:
    def __init__(self, pattern: str, ignore_case: bool, dot_all: bool) -> None:
        self.s = pattern
        self.i = 0
        self.ignore_case = ignore_case
        self.dot_all = dot_all

    def fail(self, what: str) -> ValueError:
        return ValueError(f"regex /{self.s}/ at position {self.i}: {what}")

    def read(self) -> Expr:
        expr = self.alternation(0)
        if self.i < len(self.s):
            raise self.fail("unbalanced ')'")
        return expr

    def alternation(self, depth: int) -> Expr:
        if depth > MAX_NESTING:
            raise self.fail(f"groups nested deeper than {MAX_NESTING}")
        options = [self.sequence(depth)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            options.append(self.sequence(depth))
        return alt(options)

    def sequence(self, depth: int) -> Expr:
        items: list[Expr] = []
        while self.i < len(self.s) and self.s[self.i] not in "|)":
            items.append(self.quantified(self.atom(depth)))
        return seq(items) if items else Lit("")

    def atom(self, depth: int) -> Expr:
        s, c = self.s, self.s[self.i]
        if c == "(":
            self.i += 1
            if s.startswith("?:", self.i):
                self.i += 2
            elif s.startswith("?P<", self.i):
                end = s.find(">", self.i)
                if end < 0:
                    raise self.fail("unterminated group name")
                self.i = end + 1
            elif s.startswith("?", self.i):
                raise self.fail("lookaround, inline flags and back-references are not supported")
            inner = self.alternation(depth + 1)
            if self.i >= len(s) or s[self.i] != ")":
                raise self.fail("missing ')'")
            self.i += 1
            return inner
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return _ANY if self.dot_all else _ANY_BUT_NEWLINE
        if c in "^$":
            raise self.fail(f"anchor {c!r} is not supported (a terminal's match is whole already)")
        if c in "*+?" or self.counts_at(self.i):
            raise self.fail("nothing to repeat")
        if c == "\\":
            escaped = self.escape(in_class=False)
            if isinstance(escaped, tuple):
                return Chars(escaped[0], negated=escaped[1])
            return char_expr(escaped, self.ignore_case)
        self.i += 1
        return char_expr(c, self.ignore_case)

    def quantified(self, atom: Expr) -> Expr:
        s = self.s
        if self.i >= len(s):
            return atom
        c = s[self.i]
        counts = self.counts_at(self.i)
        if c in "*+?":
            self.i += 1
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif counts:
            self.i = counts.end()
            low = int(counts.group(1) or 0)
            high = None if counts.group(2) and not counts.group(3) else int(counts.group(3) or low)
            if max(low, high or 0) > MAX_REPEAT_COUNT:
                raise self.fail(f"a count above {MAX_REPEAT_COUNT}")
            if high is not None and high < low:
                raise self.fail(f"min repeat greater than max repeat ({low} > {high})")
        else:
            return atom
        if self.i < len(s) and s[self.i] == "?":
            self.i += 1  # lazy: the same strings match
        if self.i < len(s) and (s[self.i] in "*+?" or self.counts_at(self.i)):
            raise self.fail("multiple repeat (possessive quantifiers are not supported)")
        return Repeat(atom, low, high)

    def counts_at(self, i: int) -> re.Match | None:
        """A {m}, {m,}, {,n} or {m,n} quantifier at i (Python reads `{}`, `{,}` and the like as literal text)."""
        counts = _COUNTS.match(self.s, i)
        return counts if counts and (counts.group(1) or counts.group(3)) else None

    def escape(self, in_class: bool) -> str | tuple[tuple[tuple[int, int], ...], bool]:
        """The escaped character, or (ranges, negated) for \\d \\w \\s \\D \\W \\S."""
        s = self.s
        if self.i + 1 >= len(s):
            raise self.fail("a trailing backslash")
        c = s[self.i + 1]
        self.i += 2
        if c.lower() in _CLASS_ESCAPES:
            if in_class and c.isupper():
                raise self.fail(f"\\{c} inside a class is not supported")
            return _CLASS_ESCAPES[c.lower()], c.isupper()
        if c in _CHAR_ESCAPES:
            return _CHAR_ESCAPES[c]
        if c == "b" and in_class:
            return "\b"
        if c in _HEX_ESCAPES:
            digits = s[self.i : self.i + _HEX_ESCAPES[c]]
            if len(digits) != _HEX_ESCAPES[c] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"\\{c} takes {_HEX_ESCAPES[c]} hex digits")
            self.i += len(digits)
            cp = int(digits, 16)
            if cp > 0x10FFFF or 0xD800 <= cp < 0xE000:
                raise self.fail(f"\\{c}{digits} is not a character")
            return chr(cp)
        if c == "0":
            octal = re.match(r"[0-7]{0,2}", s[self.i :]).group()
            self.i += len(octal)
            return chr(int("0" + octal, 8))
        if c.isdigit():
            raise self.fail("back-references are not supported")
        if c.isascii() and c.isalpha():
            raise self.fail(f"\\{c} is not supported")
        return c

    def char_class(self) -> Expr:
        s = self.s
        self.i += 1
        negated = self.i < len(s) and s[self.i] == "^"
        self.i += negated
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.i >= len(s):
                raise self.fail("unterminated character class")
            if s[self.i] == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self.class_char()
            if isinstance(lo, tuple):
                ranges.extend(lo)
                continue
            if s.startswith("-", self.i) and self.i + 1 < len(s) and s[self.i + 1] != "]":
                self.i += 1
                hi = self.class_char()
                if isinstance(hi, tuple):
                    raise self.fail("a class escape cannot end a range")
                if ord(hi) < ord(lo):
                    raise self.fail(f"bad character range {lo}-{hi}")
                ranges.append((ord(lo), ord(hi)))
            else:
                ranges.append((ord(lo), ord(lo)))
        folded = fold_case(tuple(ranges)) if self.ignore_case else tuple(ranges)
        return Chars(folded, negated)

    def class_char(self) -> str | tuple[tuple[int, int], ...]:
        if self.s[self.i] == "\\":
            escaped = self.escape(in_class=True)
            return escaped[0] if isinstance(escaped, tuple) else escaped
        self.i += 1
        return self.s[self.i - 1]
