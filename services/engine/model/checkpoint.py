"""The int8 checkpoint on disk, `convert` (GGUF -> int8 safetensors, once) and `load_model`.

Cache layout (default ~/.cache/salon, overridable): <cache_dir>/<model_id>/
    model-int8.safetensors   int8 weights (per output channel) + scales + smoothed norms
    vocab.json               the tokenizer vocabulary (tokens, scores, types, special ids)
The float32 path always dequantizes the GGUF (a few seconds) so it stays the exact reference.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from kernels.backend import Ops, select_ops
from services.engine.model.attention import DenseAttention
from services.engine.model.builder import build_float_model, build_int8_model
from services.engine.model.calibration_text import CALIBRATION_TEXT
from services.engine.model.config import ModelConfig, config_for
from services.engine.model.gguf_file import check_config, default_gguf_path, open_gguf, read_float_weights, read_vocab
from services.engine.model.model import CausalLM
from services.engine.model.quantize import DEFAULT_ALPHA, build_int8_checkpoint, calibrate
from services.engine.model.synthetic import synthetic_weights
from services.engine.model.tokenizer import Tokenizer, Vocab

CHECKPOINT_FILE = "model-int8.safetensors"
VOCAB_FILE = "vocab.json"
# Bump when the checkpoint recipe changes: old caches are then rebuilt, never misread.
CHECKPOINT_FORMAT = "salon-int8-v3"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "salon"


def checkpoint_dir(model_id: str, cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / model_id


def _float_weights_from_gguf(config: ModelConfig, gguf_path: Path | None, progress: bool):
    reader = open_gguf(gguf_path or default_gguf_path())
    check_config(reader, config)
    bar = tqdm(total=len(reader.tensors), desc="dequantize GGUF", unit="tensor", disable=not progress)
    with bar:
        weights = read_float_weights(reader, bar)
    return weights, read_vocab(reader)


def calibrate_and_quantize(config: ModelConfig, weights: dict[str, torch.Tensor], tokenizer: Tokenizer,
                           alpha: float = DEFAULT_ALPHA) -> dict[str, torch.Tensor]:
    float_model = build_float_model(config, weights, select_ops("cpu"))
    ids = tokenizer.encode(CALIBRATION_TEXT, add_bos=True, parse_special=False)

    def run(model: CausalLM) -> None:
        attn = DenseAttention(config)
        model.forward(torch.tensor(ids), attn.begin_step([len(ids)]), attn)

    return build_int8_checkpoint(config, weights, calibrate(float_model, run), alpha=alpha)


def convert(model_id: str = "gemma-3-270m", cache_dir: Path | None = None, gguf_path: Path | None = None,
            overwrite: bool = False, progress: bool = True) -> Path:
    """GGUF -> calibrated int8 safetensors checkpoint in the cache; returns its directory."""
    config = config_for(model_id)
    out_dir = checkpoint_dir(model_id, cache_dir)
    ckpt_path = out_dir / CHECKPOINT_FILE
    if ckpt_path.exists() and not overwrite and _format_of(ckpt_path) == CHECKPOINT_FORMAT:
        return out_dir
    weights, vocab = _float_weights_from_gguf(config, gguf_path, progress)
    tokenizer = Tokenizer(vocab)
    steps = tqdm(total=2, desc="calibrate + quantize", disable=not progress)
    with steps:
        tensors = calibrate_and_quantize(config, weights, tokenizer)
        steps.update(1)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / VOCAB_FILE).write_text(json.dumps(asdict(vocab)))
        tmp = ckpt_path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata={"format": CHECKPOINT_FORMAT, "model_id": model_id})
        tmp.replace(ckpt_path)  # a reader never sees a half-written checkpoint
        steps.update(1)
    return out_dir


def _format_of(path: Path) -> str | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return (f.metadata() or {}).get("format")
    except Exception:  # unreadable or truncated: treat as absent
        return None


def _load_vocab(path: Path) -> Vocab:
    raw = json.loads(path.read_text())
    return Vocab(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def load_model(name: str = "gemma-3-270m", precision: str = "int8", cache_dir: Path | None = None,
               kernel_ops: Ops | None = None, progress: bool = True) -> tuple[CausalLM, Tokenizer]:
    """(CausalLM, Tokenizer). The real model's int8 checkpoint is converted on first use."""
    if precision not in ("int8", "float32"):
        raise ValueError(f"precision must be 'int8' or 'float32', got {precision!r}")
    config = config_for(name)
    kernel_ops = kernel_ops or select_ops("cpu")
    if config.random_weights_seed is not None:
        return _load_synthetic(config, precision, kernel_ops, cache_dir, progress)
    if precision == "float32":
        weights, vocab = _float_weights_from_gguf(config, None, progress)
        return build_float_model(config, weights, kernel_ops), Tokenizer(vocab)
    out_dir = convert(name, cache_dir, progress=progress)
    tensors = load_file(str(out_dir / CHECKPOINT_FILE))
    return build_int8_model(config, tensors, kernel_ops), Tokenizer(_load_vocab(out_dir / VOCAB_FILE))


def real_vocab(cache_dir: Path | None = None, progress: bool = False) -> Vocab:
    """The Gemma vocabulary (synthetic models use it too, so token ids mean the same)."""
    out_dir = convert("gemma-3-270m", cache_dir, progress=progress)
    return _load_vocab(out_dir / VOCAB_FILE)


def _load_synthetic(config: ModelConfig, precision: str, kernel_ops: Ops, cache_dir: Path | None,
                    progress: bool) -> tuple[CausalLM, Tokenizer]:
    tokenizer = Tokenizer(real_vocab(cache_dir, progress))
    weights = synthetic_weights(config)
    if precision == "float32":
        return build_float_model(config, weights, kernel_ops), tokenizer
    calib_tensors = calibrate_and_quantize(config, weights, tokenizer)
    return build_int8_model(config, calib_tensors, kernel_ops), tokenizer


def main_convert(argv: list[str] | None = None) -> int:
    """`salon convert [--model ID] [--cache-dir DIR] [--gguf PATH] [--overwrite]`."""
    import argparse

    parser = argparse.ArgumentParser(prog="salon convert", description="GGUF -> cached int8 checkpoint")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out_dir = convert(args.model, args.cache_dir, args.gguf, overwrite=args.overwrite)
    print(f"converted {args.model} -> {out_dir / CHECKPOINT_FILE} in {time.monotonic() - started:.1f} s")
    return 0
