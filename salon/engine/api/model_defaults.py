"""A request's sampling with the model's defaults filled in for the fields it leaves to the model.

SamplingParams.model_default_fields names them ("temperature", "top_p", ...); each takes its value from
the model's SamplingDefaults (salon/engine/model/sampling_defaults.py). A field the request sets itself is
never named, so an explicit value always wins, and temperature 0 stays greedy.
"""

from __future__ import annotations

from salon.api.chat.v1 import chat_pb2
from salon.common.errors import InvalidArgument
from salon.engine.model.sampling_defaults import FIELDS, SamplingDefaults


def with_model_defaults(sampling: chat_pb2.SamplingParams, defaults: SamplingDefaults) -> chat_pb2.SamplingParams:
    """`sampling` itself when it names no field, else a copy with each named field set to the model's value."""
    names = list(sampling.model_default_fields)
    if not names:
        return sampling
    filled = chat_pb2.SamplingParams()
    filled.CopyFrom(sampling)
    del filled.model_default_fields[:]
    seen: set[str] = set()
    for i, name in enumerate(names):
        where = f"sampling.model_default_fields[{i}]"
        if name not in FIELDS:
            raise InvalidArgument(f"{where}: {name[:64]!r} is not one of {', '.join(FIELDS)}")
        if name in seen:
            raise InvalidArgument(f"{where}: {name!r} is named twice")
        if getattr(sampling, name):
            raise InvalidArgument(f"{where}: {name!r} is set in the request too ({getattr(sampling, name):g})")
        seen.add(name)
        setattr(filled, name, getattr(defaults, name))
    return filled


def default_sampling_message(defaults: SamplingDefaults) -> chat_pb2.SamplingParams:
    """The defaults as ModelInfo.default_sampling reports them."""
    return chat_pb2.SamplingParams(**{name: getattr(defaults, name) for name in FIELDS})
