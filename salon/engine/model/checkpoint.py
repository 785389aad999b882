"""The int8 checkpoint on disk: `convert` (GGUF -> calibrated int8 safetensors, once per file) and its cache.

Cache layout (default ~/.cache/salon, overridable):
    <cache_dir>/int8/<sha256 of the GGUF>/model-int8.safetensors
        int8 weights + scales (per output channel and 32 inputs, or per output channel) + norms; metadata:
        format (the architecture's INT8_CHECKPOINT_FORMAT), sha256, model id; every activation recipe runs on it
    <cache_dir>/int8/<sha256>/convert.lock
Keyed by the file's content, so a renamed or re-downloaded file finds its checkpoint and a changed file
never reads a stale one. Engines that start together convert once: the first takes the lock and
converts, the others wait on the lock and then find the finished file. The file is written under a
temporary name and renamed into place (cache_files.atomic_write): a conversion that dies half-way leaves
no checkpoint behind, only a temporary file that is never read.
The float32 path always dequantizes the GGUF (seconds) so it stays the exact reference.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from salon.engine.model.attention import DenseAttention
from salon.engine.model.builder import build_float_model
from salon.engine.model.cache_files import atomic_write, file_lock
from salon.engine.model.calibration_text import CALIBRATION_TEXT
from salon.engine.model.config import ModelConfig
from salon.engine.model.convert_progress import ConvertProgress
from salon.engine.model.model import CausalLM
from salon.engine.model.quantize import Calibration, build_int8_checkpoint, calibrate
from salon.engine.model.tokenizer import Tokenizer
from salon.kernels.backend import select_ops

CHECKPOINT_FILE = "model-int8.safetensors"


def checkpoint_format(config: ModelConfig) -> str:
    """The format tag of this model's checkpoint: its architecture's INT8_CHECKPOINT_FORMAT, bumped when the recipe
    changes, so old caches are rebuilt, never misread."""
    from salon.engine.model.models import architecture

    return architecture(config.architecture).INT8_CHECKPOINT_FORMAT


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "salon"


def checkpoint_path(sha256: str, cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / "int8" / sha256 / CHECKPOINT_FILE


# The int8 recipe the conversion ships for each architecture is the architecture's INT8_RECIPE
# (build_int8_checkpoint options) plus INT8_SMOOTH; SHIPPED_RECIPE is Gemma 3's, for the benches.
SAMPLED_SEQS, SAMPLED_TOKENS = 16, 512


@torch.inference_mode()
def sampled_sequences(
    config: ModelConfig,
    w: dict[str, torch.Tensor],
    bos_token_id: int,
    num_seqs: int = SAMPLED_SEQS,
    num_tokens: int = SAMPLED_TOKENS,
    seed: int = 0,
) -> list[list[int]]:
    """Text sampled from the float model itself (temperature 1, from BOS): num_seqs x num_tokens, seeded."""
    model = build_float_model(config, w, select_ops("cpu"))
    gen = torch.Generator().manual_seed(seed)
    attn = DenseAttention(config, num_seqs=num_seqs)
    tokens = torch.full((num_seqs,), bos_token_id, dtype=torch.int64)
    seqs = [[bos_token_id] for _ in range(num_seqs)]
    for _ in range(num_tokens - 1):
        hidden = model.forward(tokens, attn.begin_step([1] * num_seqs), attn)
        probs = torch.softmax(model.logits(hidden).double(), dim=-1)
        tokens = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        for seq, t in zip(seqs, tokens.tolist()):
            seq.append(t)
    return seqs


def calibration_sequences(
    config: ModelConfig, w: dict[str, torch.Tensor], tokenizer: Tokenizer, sampled: bool = False
) -> list[list[int]]:
    """The calibration text (calibration_text.py), plus text sampled from the float model when asked."""
    # (A synthetic config may use only the head of its tokenizer's vocabulary: ids past it are dropped.)
    seqs = [
        [
            t
            for t in tokenizer.encode(CALIBRATION_TEXT, add_bos=config.add_bos, parse_special=False)
            if t < config.vocab_size
        ]
    ]
    if sampled:
        seqs += sampled_sequences(config, w, tokenizer.bos_token_id)
    return seqs


def calibrate_float(config: ModelConfig, w: dict[str, torch.Tensor], sequences: list[list[int]]) -> Calibration:
    """What each projection (and the output projection) of the float model is fed on the sequences."""
    float_model = build_float_model(config, w, select_ops("cpu"))

    def run(model: CausalLM) -> list[torch.Tensor]:
        hidden = []
        for ids in sequences:
            attn = DenseAttention(config)
            hidden.append(model.forward(torch.tensor(ids), attn.begin_step([len(ids)]), attn))
        return hidden

    return calibrate(float_model, run)


def calibrate_and_quantize(
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    tokenizer: Tokenizer,
    **overrides,
) -> dict[str, torch.Tensor]:
    """The architecture's int8 recipe: calibrate on its calibration set, then build the checkpoint. `overrides`
    replace build_int8_checkpoint options of the recipe (measurements: bench/quant_ceilings.py)."""
    from salon.engine.model.models import architecture

    arch = architecture(config.architecture)
    recipe = dict(arch.INT8_RECIPE)
    sampled = recipe.pop("sampled_calibration", False)
    calib = calibrate_float(config, weights, calibration_sequences(config, weights, tokenizer, sampled))
    return build_int8_checkpoint(config, weights, calib, smooth=arch.INT8_SMOOTH, **{**recipe, **overrides})


def is_complete(path: Path, sha256: str, fmt: str) -> bool:
    """A finished checkpoint of the recipe `fmt` for this file (the header of a renamed-into-place file)."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
    except Exception:  # absent or unreadable: treat as absent
        return False
    return meta.get("format") == fmt and meta.get("sha256") == sha256


def ensure_checkpoint(
    model_file,
    cache_dir: Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> tuple[Path, bool]:
    """(path of the int8 checkpoint of `model_file`, whether this call converted it)."""
    from salon.engine.model.models import architecture

    source, config = model_file.source, model_file.config
    fmt = checkpoint_format(config)
    path = checkpoint_path(source.sha256, cache_dir)
    if not overwrite and is_complete(path, source.sha256, fmt):
        return path, False
    with file_lock(path.with_name("convert.lock")):
        if not overwrite and is_complete(path, source.sha256, fmt):
            return path, False  # another process converted it while this one waited
        shown = ConvertProgress(source.model_id, len(model_file.gguf.tensor_names())) if progress else None
        gguf = model_file.gguf if shown is None else _CountingReads(model_file.gguf, shown.read)
        weights = architecture(config.architecture).read_weights(gguf, config)
        extra = {}
        if shown is not None:
            shown.calibrating(weights)
            extra["on_quantized"] = shown.quantized
        tensors = calibrate_and_quantize(config, weights, Tokenizer(model_file.vocab), **extra)
        meta = {"format": fmt, "sha256": source.sha256, "model_id": source.model_id}
        atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))
        if shown is not None:
            shown.finished()
    return path, True


class _CountingReads:
    """A GGUFFile that calls on_read after each tensor it reads."""

    def __init__(self, gguf, on_read) -> None:
        self._gguf = gguf
        self._on_read = on_read

    def __getattr__(self, name: str):
        return getattr(self._gguf, name)

    def read_tensor(self, name: str):
        tensor = self._gguf.read_tensor(name)
        self._on_read()
        return tensor
