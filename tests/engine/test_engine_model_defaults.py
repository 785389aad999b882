"""SamplingParams.model_default_fields: the named fields take the model's defaults; explicit values win."""

from __future__ import annotations

import pytest

from salon.api.chat.v1 import chat_pb2
from salon.common.errors import InvalidArgument
from salon.engine.api.model_defaults import default_sampling_message, with_model_defaults
from salon.engine.api.validation import Limits, parse_sampling
from salon.engine.model.sampling_defaults import SamplingDefaults

CARD = SamplingDefaults(temperature=0.2, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1)
LIMITS = Limits(vocab_size=1000, max_context_tokens=512, default_max_new_tokens=256, max_new_tokens_limit=4096)
ALL = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty"]


def parsed(sampling: chat_pb2.SamplingParams):
    return parse_sampling(with_model_defaults(sampling, CARD), LIMITS)


def test_every_named_field_takes_the_models_value():
    s = parsed(chat_pb2.SamplingParams(max_new_tokens=9, model_default_fields=ALL))
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty) == pytest.approx((0.2, 50, 0.9, 0.05, 1.1))
    assert s.max_new_tokens == 9


def test_explicit_values_win_and_temperature_0_stays_greedy():
    s = parsed(chat_pb2.SamplingParams(temperature=0.0, top_p=0.5, model_default_fields=["top_k", "min_p"]))
    assert s.greedy and s.temperature == 0.0
    assert s.top_p == 0.5 and s.top_k == 50 and s.min_p == pytest.approx(0.05)
    assert s.repetition_penalty == 1.0  # not named, left at 0: off, as before


def test_a_request_that_names_none_is_unchanged():
    request = chat_pb2.SamplingParams(temperature=0.7, top_k=3)
    assert with_model_defaults(request, CARD) is request
    s = parse_sampling(request, LIMITS)
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty) == pytest.approx((0.7, 3, 1.0, 1.0))


@pytest.mark.parametrize(
    ("names", "temperature", "message"),
    [
        (["seed"], 0.0, r"model_default_fields\[0\]: 'seed' is not one of temperature, top_k, top_p"),
        (["top_k", "top_k"], 0.0, r"model_default_fields\[1\]: 'top_k' is named twice"),
        (["temperature"], 0.5, r"model_default_fields\[0\]: 'temperature' is set in the request too \(0.5\)"),
    ],
)
def test_bad_names_are_refused_naming_the_entry(names, temperature, message):
    with pytest.raises(InvalidArgument, match=message):
        with_model_defaults(chat_pb2.SamplingParams(temperature=temperature, model_default_fields=names), CARD)


def test_model_info_reports_the_defaults():
    m = default_sampling_message(CARD)
    assert (m.temperature, m.top_k, m.top_p, m.min_p, m.repetition_penalty) == pytest.approx((0.2, 50, 0.9, 0.05, 1.1))
    assert not m.model_default_fields
