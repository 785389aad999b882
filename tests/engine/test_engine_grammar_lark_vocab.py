"""Lark grammars through the engine's grammar compiler on SmolLM2's vocabulary (compile_now converts a Lark
constraint, then xgrammar compiles it): what the compiled grammar accepts, and a malformed one refused naming
its line while GBNF still compiles as given."""

from __future__ import annotations

import pytest

from salon.common.errors import InvalidArgument
from salon.engine.grammar.compiler import GrammarCompiler, GrammarLimits
from salon.engine.grammar.constraint import Constraint, ConstraintKind
from salon.engine.model.loader import open_model_file
from salon.engine.model.tokenizer import Tokenizer
from tests.engine.test_engine_grammar_lark import GREETING, IGNORED, JSONISH, OPERATORS, accepts


@pytest.fixture(scope="module")
def compiler():
    mf = open_model_file("smollm2-135m-instruct")
    compiler = GrammarCompiler(Tokenizer(mf.vocab), mf.config.eos_token_ids, GrammarLimits(compile_workers=0))
    yield compiler
    compiler.close()


@pytest.mark.parametrize(
    ("lark", "accepted", "refused"),
    [
        (GREETING, ["Hello, Bob!", "HELLO, Ann!", "hi, Zed!"], ["HI, Bob!", "hello, bob!", "hello, Bob", "hello,Bob!"]),
        (OPERATORS, ["a=12;", "b_q=-;c=xxx;", "f=1234;d=+A\n;", "a=A\n;"], ["a=1;", "g=12;", "a=12", "a=xx;", ""]),
        (IGNORED, ["(ab_1)", "  ( x9 )  ", "[ ]", "[]"], ["( a b )", "()", "(a", "(a)\n"]),
        (JSONISH, ['[1, "a\\"b", [ ]]', "-2.5e3", ' [ [1] ,"x" ] '], ["[1,]", '"a\nb"', "[1 2]", "+", '["]']),
    ],
)
def test_the_compiled_grammar_accepts_what_lark_would(compiler, lark, accepted, refused):
    compiled = compiler.compile_now(Constraint(ConstraintKind.GRAMMAR, lark))
    for text in accepted:
        assert accepts(compiled, text), text
    for text in refused:
        assert not accepts(compiled, text), text


def test_a_malformed_lark_grammar_is_refused_naming_the_line_and_gbnf_compiles_as_given(compiler):
    with pytest.raises(InvalidArgument) as refused:
        compiler.compile_now(Constraint(ConstraintKind.GRAMMAR, 'start: "a"\n\n  | x\n'))
    assert refused.value.message == "grammar: Lark line 3: x is not defined"
    gbnf = compiler.compile_now(Constraint(ConstraintKind.GRAMMAR, 'root ::= "a" x\nx ::= [0-9]+ # x: a comment'))
    assert accepts(gbnf, "a12") and not accepts(gbnf, "a")
