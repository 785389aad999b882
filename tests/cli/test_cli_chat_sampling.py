"""`salon chat` sends no sampling of its own: every sampling field is left to the model unless a flag sets it."""

from __future__ import annotations

from salon.api.chat.v1 import chat_pb2
from salon.cli.chat import build_parser, sampling_params

ALL = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty"]


def test_without_flags_every_sampling_field_is_the_models():
    sent = sampling_params(build_parser().parse_args([]))
    assert sent == chat_pb2.SamplingParams(model_default_fields=ALL)
    assert sent.ListFields() == [(chat_pb2.SamplingParams.DESCRIPTOR.fields_by_name["model_default_fields"], ALL)]


def test_flags_set_their_fields_and_temperature_0_is_sent_as_greedy():
    args = build_parser().parse_args(["--temperature", "0", "--repetition-penalty", "1.3", "--max-new-tokens", "12"])
    assert sampling_params(args) == chat_pb2.SamplingParams(
        max_new_tokens=12, temperature=0.0, repetition_penalty=1.3, model_default_fields=["top_k", "top_p", "min_p"]
    )
