"""Gemma 3 (text): every size of the family (270M, 1B, 4B, 12B, 27B) from its GGUF.

Per layer (x is the residual stream, f32[T, d_model]):
    h = rmsnorm(x, attn_norm);  q, k, v = qkv(h)            (KV-sharing layers compute q only)
    q, k = per-head rmsnorm(q_norm / k_norm), NEOX RoPE (the layer's base)
    x = x + rmsnorm(o(attn(q, k, v)), post_attention_norm)
    h = rmsnorm(x, ffn_norm)
    x = x + rmsnorm(down(gelu_tanh(gate(h)) * up(h)), post_ffw_norm)
Embeddings are scaled by sqrt(d_model); the output projection is the (tied) embedding matrix.

An int8 layer whose four Linears are two-term ones (the shipped recipe) with plain RoPE also runs as one fused
op over the paged int8 KV cache (salon.kernels.decoder_block, the kernel family's `decoder_block`) where the family
has it and the attention backend hands out the layer's cache (`block_kv`); the composition below is its
contract, and runs wherever the fused op declines.

From the metadata (llama.cpp's rules for gemma3): every 6th layer is global (1-based: layers 6, 12, ...)
unless `gemma3.attention.sliding_window_pattern` says otherwise, the others attend within
`gemma3.attention.sliding_window` tokens; global layers use `gemma3.rope.freq_base` (and the file's linear
RoPE scaling, if any), sliding layers base 10000 (`gemma3.rope.freq_base_swa` when present). Attention
scale 1/sqrt(head_dim), except the 62-layer 27B: 1/sqrt(d_model / num_heads). The GGUF's norm weights
already include Gemma's +1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from salon.engine.model.config import LayerSpec, ModelConfig
from salon.engine.model.gguf_file import GGUFFile, GGUFMetadataError
from salon.engine.model.layers import (
    Rotary,
    block_weights,
    fused_layer,
    linear_residual,
    norm_linear,
    norm_rope_kv,
)
from salon.engine.model.models.common import attention_geometry, rope_linear_scale
from salon.engine.model.models.common import read_weights as read_named
from salon.engine.model.vocab import Vocab
from salon.kernels.decoder_block import BlockWeights

ARCH = "gemma3"
DEFAULT_SLIDING_PATTERN = 6
DEFAULT_SWA_ROPE_BASE = 10_000.0
# int8 key smoothing goes through the per-head k-norm weight (and its inverse through the q-norm weight).
KEY_SMOOTHING = "qk_norm"
LAYER_NORMS = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
# The int8 recipe (quantize.py, bench/quant_eval.py's table): weights with one scale per output row and 32 input
# channels (weight_group, the grouped W8A8 contract of salon/kernels/w8a8_grouped.py; the grid of the GGUF's Q8_0
# token table), rounded to nearest; every activation as two int8 terms (linear.py, ~14 bits); and, with
# activations that fine, no SmoothQuant smoothing of the projections or of the output projection: smoothing
# only moves error into the weights (on the reference prompts it costs 3 of 229 teacher-forced top-1 and
# 0.005 of log-prob error). The int8 KV cache keeps its key smoothing (qk_norm, kv_beta).
INT8_SMOOTH: tuple[str, ...] = ()
INT8_ACTIVATION_TERMS = 2
# build_int8_checkpoint options of the shipped conversion (checkpoint.calibrate_and_quantize).
INT8_RECIPE: dict[str, object] = {"alpha": 0.5, "weight_group": 32}
# The checkpoint's format tag (checkpoint.py): bumped when INT8_RECIPE changes, so old caches are converted again.
INT8_CHECKPOINT_FORMAT = "salon-int8-v8"  # v8: v7 (one weight scale per row and 32 input channels) calibrated
# through the fixed-order RMSNorm (salon/kernels/rmsnorm.py)
# The Linears that take one int8 term per token and 32 channels (salon.kernels.w8a8_group32) under `--activations
# group32`, on the same checkpoint: the decoder layers' projections; the output projection is rescored (below: with it
# in plain group32, 220 of 229 teacher-forced top-1 steps, under the gate of 223).
INT8_GROUP32_RECIPE: tuple[str, ...] = ("qkv", "o", "gate_up", "down")
# The Linears the group32 recipe runs as group32 rescored (salon.kernels.linear_rescored): the output projection, whose
# greedy choice is then the two-term one's (its products halved: a decode step of several sequences is bound by them).
INT8_GROUP32_RESCORED: tuple[str, ...] = ("lm_head",)


def _sliding_layers(f: GGUFFile, num_layers: int) -> list[bool]:
    pattern = f.get(f"{ARCH}.attention.sliding_window_pattern", DEFAULT_SLIDING_PATTERN)
    if isinstance(pattern, list):  # one flag per layer: true = sliding window
        if len(pattern) != num_layers:
            raise GGUFMetadataError(
                f"{f.path.name}: {ARCH}.attention.sliding_window_pattern has {len(pattern)} "
                f"entries for {num_layers} layers"
            )
        return [bool(p) for p in pattern]
    period = int(pattern)  # llama.cpp's swa pattern: the last layer of each period is global; 0 = all sliding
    return [period == 0 or (i % period) < period - 1 for i in range(num_layers)]


def config_from_gguf(f: GGUFFile, model_id: str, sha256: str, vocab: Vocab) -> ModelConfig:
    d_model, num_heads, num_kv_heads, head_dim = attention_geometry(f, ARCH)
    num_layers = f.get_int(f"{ARCH}.block_count")
    window = f.get_int(f"{ARCH}.attention.sliding_window")
    global_base = f.get_float(f"{ARCH}.rope.freq_base", 1_000_000.0)
    local_base = f.get_float(f"{ARCH}.rope.freq_base_swa", DEFAULT_SWA_ROPE_BASE)
    global_scale = rope_linear_scale(f, ARCH)
    layers = tuple(
        LayerSpec("sliding", window, local_base)
        if sliding
        else LayerSpec("global", None, global_base, rope_position_scale=global_scale)
        for sliding in _sliding_layers(f, num_layers)
    )
    attn_scale = 1.0 / math.sqrt(d_model / num_heads if num_layers == 62 else head_dim)
    return ModelConfig(
        model_id=model_id,
        vocab_size=len(vocab.tokens),
        d_model=d_model,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        ffn_dim=f.get_int(f"{ARCH}.feed_forward_length"),
        rms_norm_eps=f.get_float(f"{ARCH}.attention.layer_norm_rms_epsilon"),
        max_context_tokens=f.get_int(f"{ARCH}.context_length"),
        bos_token_id=vocab.bos_token_id,
        eos_token_ids=vocab.end_of_generation_ids(),
        layers=layers,
        attn_scale=attn_scale,
        pad_token_id=vocab.pad_token_id,
        architecture=ARCH,
        activation="gelu_tanh",
        qk_norm=True,
        post_norms=True,
        embedding_multiplier=math.sqrt(d_model),
        tied_embeddings=not f.has_tensor("output"),
        add_bos=vocab.add_bos,
        weights_sha256=sha256,
    )


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, hq, hkv, hd, ffn = config.d_model, config.num_heads, config.num_kv_heads, config.head_dim, config.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {"embed": (config.vocab_size, d), "final_norm": (d,)}
    if not config.tied_embeddings:
        shapes["lm_head"] = (config.vocab_size, d)
    for i in range(config.num_layers):
        p = f"layers.{i}."
        shapes.update({p + n: (d,) for n in LAYER_NORMS})
        shapes.update(
            {
                p + "attn_q": (hq * hd, d),
                p + "attn_k": (hkv * hd, d),
                p + "attn_v": (hkv * hd, d),
                p + "attn_q_norm": (hd,),
                p + "attn_k_norm": (hd,),
                p + "attn_output": (d, hq * hd),
                p + "ffn_gate": (ffn, d),
                p + "ffn_up": (ffn, d),
                p + "ffn_down": (d, ffn),
            }
        )
    return shapes


def read_weights(f: GGUFFile, config: ModelConfig) -> dict[str, torch.Tensor]:
    return read_named(f, ARCH, weight_shapes(config))


@dataclass
class Gemma3DecoderLayer:
    config: ModelConfig
    layer_idx: int
    rotary: Rotary
    kernel_ops: object
    attn_norm: torch.Tensor
    qkv: object  # Linear: d_model -> (Hq + 2*Hkv) * D, or Hq * D for KV-sharing layers
    q_norm: torch.Tensor
    k_norm: torch.Tensor | None
    o: object  # Linear: Hq * D -> d_model
    post_attention_norm: torch.Tensor
    ffn_norm: torch.Tensor
    gate_up: object  # Linear with GeGLU epilogue: d_model -> ffn_dim
    down: object  # Linear: ffn_dim -> d_model
    post_ffw_norm: torch.Tensor
    block: BlockWeights | None = None  # the layer as the fused op takes it (layers.block_weights), or None

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor:
        out = fused_layer(self.block, self.kernel_ops, self.layer_idx, x, attn)
        if out is not None:
            return out
        cfg = self.config
        eps = cfg.rms_norm_eps
        t, hq, hkv, d = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv = norm_linear(x, self.attn_norm, self.qkv, eps, self.kernel_ops)
        q, k, v = qkv[:, : hq * d].reshape(t, hq, d), None, None
        if cfg.layers[self.layer_idx].kv_source_layer is None:
            k = qkv[:, hq * d : (hq + hkv) * d].reshape(t, hkv, d)
            v = qkv[:, (hq + hkv) * d :].reshape(t, hkv, d)
        q, k, v = norm_rope_kv(
            self.rotary, self.kernel_ops, attn, self.layer_idx, q, k, v, self.q_norm, self.k_norm, eps, positions
        )
        o = attn(self.layer_idx, q, k, v)
        x = linear_residual(o.reshape(t, hq * d), self.o, x, eps, self.kernel_ops, self.post_attention_norm)
        h = norm_linear(x, self.ffn_norm, self.gate_up, eps, self.kernel_ops)
        return linear_residual(h, self.down, x, eps, self.kernel_ops, self.post_ffw_norm)

    def nbytes(self) -> int:
        norms = (self.attn_norm, self.q_norm, self.k_norm, self.post_attention_norm, self.ffn_norm, self.post_ffw_norm)
        return sum(lin.nbytes() for lin in (self.qkv, self.o, self.gate_up, self.down)) + sum(
            t.numel() * 4 for t in norms if t is not None
        )


def build_layer(config: ModelConfig, i: int, weights, kernel_ops) -> Gemma3DecoderLayer:
    p = f"layers.{i}."
    spec = config.layers[i]
    rotary = Rotary(
        kernel_ops.rope_neox, config.head_dim, spec.rope_base, spec.rope_position_scale, kernel_ops=kernel_ops
    )
    layer = Gemma3DecoderLayer(
        config=config,
        layer_idx=i,
        rotary=rotary,
        kernel_ops=kernel_ops,
        attn_norm=weights.tensor(p + "attn_norm"),
        qkv=weights.linear(p + "qkv"),
        q_norm=weights.tensor(p + "attn_q_norm"),
        k_norm=weights.tensor(p + "attn_k_norm"),
        o=weights.linear(p + "o"),
        post_attention_norm=weights.tensor(p + "post_attention_norm"),
        ffn_norm=weights.tensor(p + "ffn_norm"),
        gate_up=weights.linear(p + "gate_up", "gelu_tanh"),
        down=weights.linear(p + "down"),
        post_ffw_norm=weights.tensor(p + "post_ffw_norm"),
    )
    layer.block = block_weights(
        config,
        i,
        rotary,
        layer.attn_norm,
        layer.qkv,
        layer.o,
        layer.ffn_norm,
        layer.gate_up,
        layer.down,
        layer.q_norm,
        layer.k_norm,
        layer.post_attention_norm,
        layer.post_ffw_norm,
    )
    return layer
