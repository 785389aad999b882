import json

import pytest

from salon.engine.model import IncrementalDetokenizer
from tests.model.conftest import reference_path


def _vectors():
    return [json.loads(line) for line in reference_path("tokenize.jsonl").read_text().splitlines() if line]


def test_every_reference_vector_exactly(tokenizer):
    vectors = _vectors()
    assert len(vectors) == 46
    for rec in vectors:
        ids = tokenizer.encode(rec["text"], add_bos=rec["add_bos"], parse_special=rec["parse_special"])
        assert ids == rec["ids"], rec["text"]


def test_round_trip_exact(tokenizer):
    for rec in _vectors():
        ids = tokenizer.encode(rec["text"], add_bos=False, parse_special=rec["parse_special"])
        assert tokenizer.decode(ids) == rec["text"]


def test_special_ids(tokenizer):
    assert tokenizer.vocab_size == 262144
    assert tokenizer.encode("Hello world", add_bos=True, parse_special=True) == [2, 9259, 1902]
    assert tokenizer.encode("<end_of_turn>", add_bos=False, parse_special=True) == [106]
    assert tokenizer.encode("\x07", add_bos=False, parse_special=True) == [238 + 7]


@pytest.mark.parametrize("text", ["I love 🍕!", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ᚠᛇᚻ \x07bell", "Café 東京 naïve", "Привет мир"])
def test_incremental_detokenizer_never_breaks_utf8(tokenizer, text):
    ids = tokenizer.encode(text, add_bos=True, parse_special=True)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.feed(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_incremental_detokenizer_holds_partial_character(tokenizer):
    # U+1D518 is four UTF-8 bytes; feed them as byte-fallback tokens one by one.
    byte_ids = [238 + b for b in "𝔘".encode()]
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.feed(i) for i in byte_ids] == ["", "", "", "𝔘"]
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.feed(byte_ids[0]) == ""
    assert detok.flush() == "\ufffd"  # a truncated stream ends with a replacement, never raw bytes
