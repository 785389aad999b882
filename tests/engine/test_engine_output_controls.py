"""The output side of vLLM's controls (core/output.py, model/tokenizer.py): include_stop_str_in_output, stop
strings not matched before min_tokens, skip_special_tokens and spaces_between_special_tokens, on the synthetic
model's real tokenizer."""

from __future__ import annotations

import pytest

from salon.engine.core.output import OutputState
from salon.engine.model.tokenizer import IncrementalDetokenizer
from salon.engine.request import FinishReason, Request, RequestId, SamplingParams
from salon.engine.worker.model_loading import load_model


@pytest.fixture(scope="module")
def tokenizer():
    return load_model("synthetic-tiny")[1]


def replay(tokenizer, text: str, **sampling) -> tuple[str, FinishReason | None, int]:
    """Feed `text`'s tokens as if sampled; (streamed text, finish reason, tokens consumed)."""
    ids = tokenizer.encode(text, add_bos=False, parse_special=True)
    request = Request(RequestId("r"), [1], SamplingParams(max_new_tokens=len(ids) + 5, **sampling), frozenset(), 4096)
    state = OutputState(request, tokenizer)
    out = []
    for t in ids:
        request.output_token_ids.append(t)
        delta, finish = state.on_token(t)
        out.append(delta)
        if finish is not None:
            return "".join(out), finish, request.num_output_tokens
    return "".join(out), None, request.num_output_tokens


def test_the_stop_string_is_kept_with_include_stop_str_in_output(tokenizer):
    text = "one two three four five"
    assert replay(tokenizer, text, stop_strings=("three",))[:2] == ("one two ", FinishReason.STOP_STRING)
    kept = replay(tokenizer, text, stop_strings=("three",), include_stop_str_in_output=True)
    assert kept[:2] == ("one two three", FinishReason.STOP_STRING)


def test_stop_strings_are_not_matched_before_min_tokens(tokenizer):
    text = "stop here, then more words and stop again at the end"
    num_first = len(tokenizer.encode("stop here", add_bos=False, parse_special=True))
    early = replay(tokenizer, text, stop_strings=("stop",))
    assert early[:2] == ("", FinishReason.STOP_STRING)
    late = replay(tokenizer, text, stop_strings=("stop",), min_tokens=num_first + 1)
    assert late[:2] == ("stop here, then more words and ", FinishReason.STOP_STRING)


def test_special_tokens_are_skipped_or_shown_with_or_without_spaces(tokenizer):
    special = next(i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i) and tokenizer.token_bytes(i))
    markup = tokenizer.token_bytes(special).decode()
    ids = tokenizer.encode("Hi", add_bos=False, parse_special=False)
    ids = ids + [special] + tokenizer.encode("there", add_bos=False, parse_special=False)

    def text(**kw) -> str:
        detok = IncrementalDetokenizer(tokenizer, **kw)
        return "".join(detok.feed(t) for t in ids) + detok.flush()

    assert text() == "Hithere"
    assert text(skip_special=False) == f"Hi{markup}there"
    assert text(skip_special=False, spaces_between_special=True) == f"Hi {markup} there"
    assert text(skip_special=True, spaces_between_special=True) == "Hithere"
