"""A model's default sampling: what a request gets for the sampling fields it leaves to the model.

Each field comes from the first of these that has it:

    the GGUF's general.sampling.* metadata   llama.cpp's keys: temp, top_k, top_p, min_p, penalty_repeat
    the known-models table                   sources.KNOWN_MODELS, from the model card
    NEUTRAL                                  temperature 1, no top-k / top-p / min-p, no penalty (vLLM's)

vLLM does the same with a checkpoint's generation_config.json. A value outside the range a request may
set is refused with GGUFMetadataError naming the key: a model file cannot give what a request cannot ask.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from salon.engine.model.gguf_file import GGUFFile, GGUFMetadataError

# The largest temperature and repetition penalty a request may set (salon/engine/api/validation.py).
MAX_TEMPERATURE = 100.0
MAX_REPETITION_PENALTY = 100.0


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0  # 1 = no limit
    min_p: float = 0.0  # 0 = none
    repetition_penalty: float = 1.0  # 1 = none (vLLM's semantics: prompt and reply tokens)


NEUTRAL = SamplingDefaults()
FIELDS = tuple(f.name for f in dataclasses.fields(SamplingDefaults))

# SamplingDefaults field -> GGUF key (gguf-py's Keys.General.SAMPLING_*).
GGUF_KEYS = {
    "temperature": "general.sampling.temp",
    "top_k": "general.sampling.top_k",
    "top_p": "general.sampling.top_p",
    "min_p": "general.sampling.min_p",
    "repetition_penalty": "general.sampling.penalty_repeat",
}


def _in_range(name: str, value: float) -> bool:
    if not math.isfinite(value):
        return False
    if name == "temperature":
        return 0 <= value <= MAX_TEMPERATURE
    if name == "top_k":
        return value >= 0 and value == int(value)
    if name == "top_p":
        return 0 < value <= 1
    if name == "min_p":
        return 0 <= value <= 1
    return 0 < value <= MAX_REPETITION_PENALTY


def sampling_defaults(f: GGUFFile | None, card: Mapping[str, float] | None) -> SamplingDefaults:
    """The defaults of the model in `f` (None: no file of its own) whose card gives `card` (values by field name;
    None: no entry)."""
    base = dataclasses.replace(NEUTRAL, **(card or {}))
    found: dict[str, float | int] = {}
    for name, key in GGUF_KEYS.items():
        if f is None or not f.has(key):
            continue
        value = f.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _in_range(name, float(value)):
            raise GGUFMetadataError(f"{f.path.name}: {key} = {value!r} is not a usable {name}")
        found[name] = int(value) if name == "top_k" else float(value)
    return dataclasses.replace(base, **found)
