"""From a model name to a runnable model: the file, its description, its tokenizer, its chat renderer.

    open_model_file(name)  -> ModelFile   the GGUF (known name or path), its vocabulary and ModelConfig
    config_for(name)       -> ModelConfig (cached per name; synthetic-* configs need no file of their own)
    load(name, precision)  -> LoadedModel (model, tokenizer, chat renderer, source)
    load_model(name, ...)  -> (CausalLM, Tokenizer)

int8 models come from the cached checkpoint (converted on first use, checkpoint.py); float32 models are
dequantized from the GGUF every time (the exact reference). Synthetic models draw seeded random weights
and use the Gemma vocabulary, so token ids mean the same as for the real model; synthetic-gemma-3-270m and
-1b (synthetic_gemma.py) are the real models' shapes with int8 weights drawn directly, which
build_synthetic_gemma makes on any device with no file (load() gives them the Gemma tokenizer where it is).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_file

from salon.engine.model.activation_recipe import serving_activations
from salon.engine.model.builder import build_float_model, build_int8_model
from salon.engine.model.checkpoint import calibrate_and_quantize, ensure_checkpoint
from salon.engine.model.config import ModelConfig, synthetic_config
from salon.engine.model.gguf_file import GGUFFile, open_gguf, read_vocab
from salon.engine.model.huge_pages import in_huge_pages
from salon.engine.model.model import CausalLM
from salon.engine.model.models import architecture
from salon.engine.model.sampling_defaults import SamplingDefaults, sampling_defaults
from salon.engine.model.sources import ModelSource, resolve_source
from salon.engine.model.synthetic import synthetic_weights
from salon.engine.model.synthetic_gemma import SYNTHETIC_GEMMA_MODELS, build_synthetic_gemma, synthetic_gemma_config
from salon.engine.model.tokenizer import Tokenizer
from salon.engine.model.vocab import Vocab
from salon.kernels.backend import Ops, select_ops

PRECISIONS = ("int8", "float32")


@dataclass(frozen=True)
class ModelFile:
    source: ModelSource
    gguf: GGUFFile
    vocab: Vocab
    config: ModelConfig
    # `tokenizer.chat_template` (Jinja), None when the file has none (the base Gemma GGUF).
    chat_template: str | None
    # What a request gets for the sampling fields it leaves to the model.
    sampling: SamplingDefaults = SamplingDefaults()


def open_model_file(name: str, cache_dir: Path | None = None) -> ModelFile:
    """The GGUF behind `name` (a known name, a path, or synthetic-* over the Gemma vocabulary), described."""
    if name.startswith("synthetic-"):
        config = synthetic_gemma_config(name) if name in SYNTHETIC_GEMMA_MODELS else synthetic_config(name)
        gemma = open_model_file("gemma-3-270m", cache_dir)
        return ModelFile(gemma.source, gemma.gguf, gemma.vocab, config, None)  # neutral sampling: not Gemma's
    source = resolve_source(name, cache_dir)
    f = open_gguf(source.path)
    arch = architecture(f.architecture)
    vocab = read_vocab(f)
    config = arch.config_from_gguf(f, source.model_id, source.sha256, vocab)
    template = f.get("tokenizer.chat_template", None)
    sampling = sampling_defaults(f, source.card_sampling)
    return ModelFile(source, f, vocab, config, str(template) if template else None, sampling)


@functools.lru_cache(maxsize=16)
def config_for(name: str) -> ModelConfig:
    if name in SYNTHETIC_GEMMA_MODELS:  # no file at all: the benches of a GPU without the Gemma package use these
        return synthetic_gemma_config(name)
    if name.startswith("synthetic-"):
        return synthetic_config(name)
    return open_model_file(name).config


@dataclass(frozen=True)
class LoadedModel:
    model: CausalLM
    tokenizer: Tokenizer
    chat: object  # chat_renderer.ChatRenderer for this file's template (or Gemma's turn format)
    source: ModelSource
    sampling: SamplingDefaults = SamplingDefaults()


def load(
    name: str = "gemma-3-270m",
    precision: str = "int8",
    cache_dir: Path | None = None,
    kernel_ops: Ops | None = None,
    progress: bool = True,
    huge_pages: bool = True,
) -> LoadedModel:
    """The model behind `name`. An int8 model's Linears run the activation recipe of `kernel_ops` if it names one,
    else its architecture's (activation_recipe.serving_activations). An int8 checkpoint's tensors go into huge pages
    (huge_pages.py; False leaves them where the file maps them or the allocator put them: a bench's baseline)."""
    from salon.engine.model.chat_renderer import ChatRenderer

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be 'int8' or 'float32', got {precision!r}")
    kernel_ops = kernel_ops or select_ops("cpu")
    mf = open_model_file(name, cache_dir)
    tokenizer = Tokenizer(mf.vocab)
    config = mf.config
    if precision == "int8":
        kernel_ops = serving_activations(config.architecture, kernel_ops)
    placed = in_huge_pages if huge_pages else (lambda tensors: tensors)
    if name in SYNTHETIC_GEMMA_MODELS:
        if precision != "int8":
            raise ValueError(f"{name} has int8 weights only")
        model = build_synthetic_gemma(name, kernel_ops)
    elif config.random_weights_seed is not None:
        weights = synthetic_weights(config)
        model = (
            build_float_model(config, weights, kernel_ops)
            if precision == "float32"
            else build_int8_model(config, placed(calibrate_and_quantize(config, weights, tokenizer)), kernel_ops)
        )
    elif precision == "float32":
        model = build_float_model(config, architecture(config.architecture).read_weights(mf.gguf, config), kernel_ops)
    else:
        path, _ = ensure_checkpoint(mf, cache_dir, progress=progress)
        model = build_int8_model(config, placed(load_file(str(path))), kernel_ops)
    chat = ChatRenderer(tokenizer, mf.chat_template, config.eos_token_ids)
    return LoadedModel(model, tokenizer, chat, mf.source, mf.sampling)


def load_model(
    name: str = "gemma-3-270m",
    precision: str = "int8",
    cache_dir: Path | None = None,
    kernel_ops: Ops | None = None,
    progress: bool = True,
    huge_pages: bool = True,
) -> tuple[CausalLM, Tokenizer]:
    """(CausalLM, Tokenizer). A real model's int8 checkpoint is converted on first use."""
    loaded = load(name, precision, cache_dir, kernel_ops, progress, huge_pages)
    return loaded.model, loaded.tokenizer
