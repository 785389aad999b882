"""Gemma 3 270M and 1B at their real shapes with seeded random int8 weights: no file, no tokenizer.

    synthetic-gemma-3-270m   Gemma 3 270M: d_model 640, 18 layers, 4 query heads over 1 KV head of 256, ffn 2048
    synthetic-gemma-3-1b     Gemma 3 1B:   d_model 1152, 26 layers, 4 query heads over 1 KV head of 256, ffn 6912

Both over Gemma's 262,144-id vocabulary, 5 sliding layers (window 512, RoPE base 10,000) per global one (RoPE base
1,000,000), no cross-layer KV sharing (the released models share none). The config comes from the same code as
a real file's (models/gemma3.config_from_gguf) fed the released files' metadata, so a synthetic model runs exactly
the layer kinds, windows, RoPE bases, attention scale and norms the real one does; only the weights differ.

The weights are drawn directly in the int8 checkpoint's form (builder.py's names: fused projections as int8
[N, K] with one float32 scale per output row and 32 input channels, the grouped W8A8 contract) on the target
device from a seeded generator: a GPU builds 1B parameters in well under a second and nothing travels with the
repository. The scales make every dequantized row have about unit norm over sqrt(fan_in), so activations stay
O(1) through the layers (the same rule as synthetic.py's float weights). The numbers are not a language model's:
these models are for speed and shape checks (benches feeding token ids), not for quality.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from salon.engine.model.builder import build_int8_model
from salon.engine.model.config import GEMMA3_EOS_TOKEN_IDS, GEMMA3_VOCAB_SIZE, ModelConfig
from salon.engine.model.model import CausalLM
from salon.engine.model.models import gemma3
from salon.kernels.backend import Ops

# The released GGUFs' metadata that config_from_gguf reads (keys it does not find take its defaults, as for the
# real files: sliding pattern 6, SWA RoPE base 10,000, no RoPE scaling).
_COMMON = {
    "gemma3.attention.head_count": 4,
    "gemma3.attention.head_count_kv": 1,
    "gemma3.attention.key_length": 256,
    "gemma3.attention.value_length": 256,
    "gemma3.attention.sliding_window": 512,
    "gemma3.rope.freq_base": 1_000_000.0,
    "gemma3.attention.layer_norm_rms_epsilon": float(torch.tensor(1e-6, dtype=torch.float32)),
    "gemma3.context_length": 32768,
}
GEMMA_METADATA = {
    "synthetic-gemma-3-270m": {
        **_COMMON,
        "gemma3.block_count": 18,
        "gemma3.embedding_length": 640,
        "gemma3.feed_forward_length": 2048,
    },
    "synthetic-gemma-3-1b": {
        **_COMMON,
        "gemma3.block_count": 26,
        "gemma3.embedding_length": 1152,
        "gemma3.feed_forward_length": 6912,
    },
}
SYNTHETIC_GEMMA_MODELS = tuple(GEMMA_METADATA)
WEIGHT_GROUP = 32  # input channels per weight scale (gemma3.INT8_RECIPE's weight_group)
_MISSING = object()


class _Metadata:
    """The part of GGUFFile that config_from_gguf reads, over a dict (no tensors: the output is tied)."""

    def __init__(self, name: str, values: dict) -> None:
        self.path = Path(name + ".gguf")
        self.values = values

    def get(self, key: str, default=_MISSING):
        if key in self.values:
            return self.values[key]
        if default is _MISSING:
            raise KeyError(key)
        return default

    def get_int(self, key: str, default=_MISSING) -> int:
        return int(self.get(key, default))

    def get_float(self, key: str, default=_MISSING) -> float:
        return float(self.get(key, default))

    def has_tensor(self, name: str) -> bool:
        return False


@dataclass(frozen=True)
class _GemmaIds:
    """What config_from_gguf reads of a vocabulary: Gemma's size and special ids (no pieces)."""

    tokens: range = range(GEMMA3_VOCAB_SIZE)
    bos_token_id: int = 2
    pad_token_id: int = 0
    add_bos: bool = True

    def end_of_generation_ids(self) -> tuple[int, ...]:
        return GEMMA3_EOS_TOKEN_IDS


def synthetic_gemma_config(name: str) -> ModelConfig:
    if name not in GEMMA_METADATA:
        raise ValueError(f"unknown synthetic Gemma model {name!r} (known: {', '.join(SYNTHETIC_GEMMA_MODELS)})")
    return gemma3.config_from_gguf(_Metadata(name, GEMMA_METADATA[name]), name, "", _GemmaIds())


def int8_shapes(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every checkpoint tensor's (shape, dtype): the int8 fused projections and their group scales, the norms."""
    d, hq, hkv, hd, f = config.d_model, config.num_heads, config.num_kv_heads, config.head_dim, config.ffn_dim
    if d % WEIGHT_GROUP or f % WEIGHT_GROUP or (hq * hd) % WEIGHT_GROUP:
        raise ValueError(f"{config.model_id}: every Linear's input must be a multiple of {WEIGHT_GROUP}")

    def linear(name: str, n: int, k: int) -> dict:
        return {name + ".w_q": ((n, k), torch.int8), name + ".w_scale": ((n, k // WEIGHT_GROUP), torch.float32)}

    shapes = {**linear("embed", config.vocab_size, d), "final_norm": ((d,), torch.float32)}
    for i, spec in enumerate(config.layers):
        p = f"layers.{i}."
        own_kv = spec.kv_source_layer is None
        shapes.update(linear(p + "qkv", (hq + (2 * hkv if own_kv else 0)) * hd, d))
        shapes.update(linear(p + "o", d, hq * hd))
        shapes.update(linear(p + "gate_up", 2 * f, d))
        shapes.update(linear(p + "down", d, f))
        shapes.update({p + norm: ((d,), torch.float32) for norm in gemma3.LAYER_NORMS})
        for head_norm in ("attn_q_norm", "attn_k_norm") if own_kv else ("attn_q_norm",):
            shapes[p + head_norm] = ((hd,), torch.float32)
    return shapes


def synthetic_int8_checkpoint(config: ModelConfig, device: str | torch.device = "cpu", seed: int = 0) -> dict:
    """The int8 checkpoint of `config`, drawn on `device` from `seed` (the same tensors for the same device kind)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    ckpt = {}
    for name, (shape, dtype) in int8_shapes(config).items():
        if dtype == torch.int8:
            ckpt[name] = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8, device=device)
        elif name.endswith(".w_scale"):
            # uniform ints in [-127, 127] have std ~73.3: a row of K of them scaled by 1/(73.3 sqrt(K)) has norm ~1;
            # the embedding rows are kept small (Gemma multiplies them by sqrt(d_model))
            fan_in = shape[1] * WEIGHT_GROUP
            base = 0.05 / 73.3 if name.startswith("embed.") else 1.0 / (73.3 * math.sqrt(fan_in))
            ckpt[name] = base * (0.75 + 0.5 * torch.rand(shape, generator=gen, device=device))
        else:  # norm weights around 1 (they already include Gemma's +1)
            ckpt[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen, device=device)
    return ckpt


def build_synthetic_gemma(name: str, kernel_ops: Ops, device: str | torch.device = "cpu", seed: int = 0) -> CausalLM:
    """The int8 model `name` on `device` with `kernel_ops` (its weights never leave the device)."""
    from salon.engine.model.placement import place

    config = synthetic_gemma_config(name)
    model = build_int8_model(config, synthetic_int8_checkpoint(config, device, seed), kernel_ops)
    if torch.device(device).type != "cpu":
        place(model, device)  # what build_int8_model derived on the host (RoPE tables, ...) joins the weights
    return model
