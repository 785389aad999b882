"""Lark grammars converted to xgrammar's EBNF (salon/engine/grammar/lark.py, lark_regex.py): the exact EBNF of
small grammars, GBNF told from Lark, /regex/ terminals against Python's `re` on seeded random patterns, a
%ignore grammar against a hand-written equivalent regex on seeded random strings (both compiled by xgrammar
over a byte vocabulary), and malformed or hostile grammars refused naming the line before anything compiles.
On a real vocabulary, through the engine's compiler: test_engine_grammar_lark_vocab.py."""

from __future__ import annotations

import functools
import itertools
import random
import re

import pytest
import xgrammar

from salon.common.errors import InvalidArgument
from salon.engine.grammar.constraint import MAX_GRAMMAR_BYTES
from salon.engine.grammar.lark import as_ebnf, is_lark, lark_to_ebnf

GREETING = """
// a comment
start: greeting ", " NAME "!"   # another
greeting: "hello"i | "hi"
NAME: /[A-Z][a-z]+/
"""
GREETING_EBNF = """root ::= start
start ::= greeting ", " NAME "!"
greeting ::= [Hh] [Ee] [Ll] [Ll] [Oo] | "hi"
NAME ::= [A-Z] [a-z]+
"""

OPERATORS = """
?start: _pair+ -> pairs
_pair: KEY "=" (value | "-") ";"
value.2: DIGIT ~ 2..4
    | "x" ~ 3
    | [SIGN] "\\x41\\n"
KEY: "a".."f" ("_" | "a".."z")*
!unused: "never"
SIGN: "+" | "-"
%import common.DIGIT
"""
OPERATORS_EBNF = r"""root ::= start
start ::= _pair+
_pair ::= KEY "=" (value | "-") ";"
value ::= DIGIT{2,4} | "x"{3} | SIGN? "A\n"
KEY ::= [a-f] ("_" | [a-z])*
SIGN ::= "+" | "-"
DIGIT ::= [0-9]
"""

IGNORED = r"""
start: "(" NAME ")" | root
root: "[" "]"
NAME: /\w+/
%ignore " "
"""
IGNORED_EBNF = r"""root ::= start __ignore
start ::= __ignore "(" __ignore NAME __ignore ")" | __root
__root ::= __ignore "[" __ignore "]"
NAME ::= [0-9A-Z_a-z]+
__ignore ::= " "*
"""

# No `start`: the first rule is the root (as vLLM reads it); common terminals bring what they use.
JSONISH = r"""
?value: list | ESCAPED_STRING | SIGNED_NUMBER
list: "[" [value ("," value)*] "]"
%import common (ESCAPED_STRING, SIGNED_NUMBER)
%import common.WS
%ignore WS
"""


@functools.cache
def byte_compiler() -> xgrammar.GrammarCompiler:
    """A compiler over a vocabulary of the 256 bytes (compiles in microseconds: for many random grammars)."""
    vocab = [bytes([b]) for b in range(256)] + [b"<eos>"]
    info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, stop_token_ids=[256])
    return xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def accepts(compiled, text: str) -> bool:
    matcher = xgrammar.GrammarMatcher(compiled)
    return matcher.accept_string(text) and matcher.is_completed()


@pytest.mark.parametrize(
    ("lark", "ebnf"), [(GREETING, GREETING_EBNF), (OPERATORS, OPERATORS_EBNF), (IGNORED, IGNORED_EBNF)]
)
def test_small_grammars_convert_to_exact_ebnf(lark, ebnf):
    assert lark_to_ebnf(lark) == ebnf
    assert is_lark(lark) and as_ebnf(lark) == ebnf


def test_gbnf_is_told_from_lark_as_vllm_does():
    gbnf = 'root ::= "a" item\n# item: a comment in Lark style\nitem ::= [0-9]'
    assert not is_lark(gbnf) and as_ebnf(gbnf) == gbnf
    assert is_lark('start: "::=" // root ::= x\n')  # in a literal and a comment: still Lark
    assert is_lark('start: "a"')


@pytest.mark.parametrize(
    ("lark", "accepted", "refused"),
    [
        ('start: "(" start ")" |', ["", "(())"], ["(()", ")"]),
        ('start: a*\na: a a | "b"', ["", "bbb"], ["c"]),
        ('start: a\na: (a "q")* "y"', ["y", "yqy", "yqyqy"], ["yq", ""]),
        ('start: "x" | a\na: b ~ 2 | "y"\nb: "" a', ["x", "y", "yy", "yyy"], ["", "xy"]),
    ],
)
def test_recursive_rules_that_can_end_are_kept(lark, accepted, refused):
    compiled = byte_compiler().compile_grammar(lark_to_ebnf(lark))
    for text in accepted:
        assert accepts(compiled, text), text
    for text in refused:
        assert not accepts(compiled, text), text


def random_regex(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth >= 2 or roll < 0.5:
        atom = rng.choice(["a", "b", "A", "1", "_", " ", ".", r"\d", r"\w", r"\s", r"\W", "[a-c]", "[^b]", "[A-Z_]"])
    else:
        parts = [random_regex(rng, depth + 1) for _ in range(rng.randint(1, 3))]
        atom = "(" + "|".join(parts) + ")" if roll < 0.75 else "(?:" + "".join(parts) + ")"
    return atom + rng.choice(["", "", "", "*", "+", "?", "{1,2}", "{2}", "{,1}", "*?"])


@pytest.mark.parametrize("seed", range(4))
def test_regex_terminals_match_what_python_re_matches(seed):
    # Every string of up to 3 characters over a small alphabet, against 10 random patterns per seed.
    rng = random.Random(seed)
    strings = ["".join(p) for n in range(4) for p in itertools.product("aAb1_ .\n", repeat=n)]
    num_matched = 0
    for _ in range(10):
        pattern = "".join(random_regex(rng) for _ in range(rng.randint(1, 3)))
        flags = rng.choice(["", "", "i", "s"])
        py_flags = {"": 0, "i": re.IGNORECASE, "s": re.DOTALL}[flags]
        compiled = byte_compiler().compile_grammar(lark_to_ebnf(f"start: /{pattern}/{flags}"))
        for text in strings:
            expected = re.fullmatch(pattern, text, py_flags) is not None
            assert accepts(compiled, text) == expected, (pattern, flags, text)
            num_matched += expected
    assert num_matched > 100  # not a test of refusals only


IGNORING = r"""
start: item ("," item)*
item: NAME "=" value
value: INT | "true"i | WORD
NAME: /[a-z_][a-z0-9_]{0,3}/
%import common.INT
%import common.WORD
%import common.WS_INLINE
%ignore WS_INLINE
"""
# The same language written by hand: ignored blanks before every token and at the end, none inside one.
_W = "[ \t]*"
_ITEM = _W + "[a-z_][a-z0-9_]{0,3}" + _W + "=" + _W + "(?:[0-9]+|[tT][rR][uU][eE]|[A-Za-z]+)"
IGNORING_RE = re.compile(_ITEM + "(?:" + _W + "," + _ITEM + ")*" + _W)


@pytest.mark.parametrize("seed", range(3))
def test_ignored_whitespace_is_where_lark_skips_it(seed):
    rng = random.Random(seed)
    compiled = byte_compiler().compile_grammar(lark_to_ebnf(IGNORING))
    pieces = ["a", "b_", "x1", "k", "=", ",", " ", "\t", "12", "7", "true", "TRUE", "tr", "Word", "z9_", "9", "\n"]
    num_matched = 0
    for _ in range(400):
        # A valid text half the time, then a random edit or none: near misses as well as hits.
        if rng.random() < 0.5:
            items = [
                rng.choice(["", " "])
                + rng.choice(["a", "b_1", "_zz"])
                + rng.choice(["", "\t"])
                + "="
                + rng.choice(["", " "])
                + rng.choice(["42", "True", "hey"])
                + rng.choice(["", " "])
                for _ in range(rng.randint(1, 3))
            ]
            text = ",".join(items)
        else:
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        if text and rng.random() < 0.5:
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice(["", " ", "=", ",", "a", "1", "Q"]) + text[i + 1 :]
        expected = IGNORING_RE.fullmatch(text) is not None
        assert accepts(compiled, text) == expected, text
        num_matched += expected
    assert 50 < num_matched < 350


@pytest.mark.parametrize(
    ("lark", "named"),
    [
        ('start: "a"\nfoo: ( "b"\n', "Lark line 2: expected ')' to close the group, got the end of the line"),
        ('start: "a"\n\n  | x\n', "Lark line 3: x is not defined"),
        ('start: A\nA: "x" a\na: "y"', "Lark line 2: the terminal A uses the rule a"),
        ('start: A\nA: B\nB: "x" A', "Lark line 2: the terminal A uses itself"),
        ("start: /^a/", "Lark line 1: regex /^a/ at position 0: anchor '^' is not supported"),
        ("start: /a(?=b)/", "Lark line 1: regex /a(?=b)/ at position 2: lookaround"),
        (r"start: /(a)\1/", "Lark line 1: regex /(a)\\1/ at position 5: back-references are not supported"),
        ("start: /a/x", "Lark line 1: regex flag 'x' is not supported"),
        ('start: "a"\n%import foo.BAR', "Lark line 2: only the common terminals can be imported"),
        ("%import common.NOPE\nstart: NOPE", "Lark line 1: common.NOPE is not one of the common terminals"),
        ('start: _sep{"a"}', "Lark line 1: templates (name{...}) are not supported"),
        ('start: "a"\nstart: "b"', "Lark line 2: start is defined more than once"),
        (r'start: "\q"', "Lark line 1: unknown escape \\q"),
        ('start: "a" ~ 3..1', "Lark line 1: ~ 3..1: the range is empty"),
        ('start: "a" ~ 10001', "Lark line 1: ~ 10001: more than 10000"),
        ('start: "b".."a"', "Lark line 1: the range 'b'..'a' is empty"),
        ('start: "a" @', "Lark line 1: unexpected character '@'"),
        ('Start: "a"', "Lark line 1: 'Start' is not a Lark name"),
        ('start: "a"\n%declare X', "Lark line 2: %declare is not supported"),
        ('start: "a"\n%ignore start', "Lark line 2: %ignore takes terminals; start is not a defined terminal"),
        ('start: "a" "b" -> x "c"', "Lark line 1: unexpected '\"c\"'"),
        ('start: ("a" -> x)', "Lark line 1: an alias (->) may only end an alternative of a definition"),
        ('A: "a"', "Lark: no rule (a Lark grammar needs a `start` rule)"),
        ("start: start ~ 2", "Lark line 1: the rule start can never end"),  # xgrammar 0.2.9 crashes on it
        ("start: a\na: a ~ 0..2", "Lark line 2: the rule a is only a repetition of itself"),  # so does this
        ('start: "x" | a\na: b ~ 2\nb: a?', "Lark line 2: the rule a is only a repetition of itself"),
        ('start: "x" | a\na: b ~ 2 "y"\nb: "" a', "Lark line 2: the rule a can never end"),
    ],
)
def test_a_malformed_grammar_is_refused_naming_the_line(lark, named):
    with pytest.raises(InvalidArgument) as refused:
        lark_to_ebnf(lark)
    assert refused.value.message.startswith("grammar: ")
    assert named in refused.value.message


@pytest.mark.parametrize(
    ("lark", "named"),
    [
        ("start: " + "(" * 60_000 + '"a"', "groups nested deeper than 32"),
        ("start: " + "[" * 60_000 + '"a"', "groups nested deeper than 32"),
        ("start: /" + "(" * 30_000 + "a/", "groups nested deeper than 32"),
        ('start: "' + "a" * MAX_GRAMMAR_BYTES + '"', f"{MAX_GRAMMAR_BYTES + 9} bytes is more than {MAX_GRAMMAR_BYTES}"),
        ("start: " + '"a" | ' * 10_000 + '"b" @', "Lark line 1: unexpected character '@'"),
    ],
)
def test_hostile_grammars_are_refused_before_any_deep_work(lark, named):
    # Deep nesting is refused at its 33rd level (no RecursionError), a long grammar is read in one pass.
    with pytest.raises(InvalidArgument, match=re.escape(named)):
        lark_to_ebnf(lark)
