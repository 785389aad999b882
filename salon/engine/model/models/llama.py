"""Llama-family decoders (Llama 2/3, SmolLM, TinyLlama, Mistral-style files with `general.architecture = llama`).

Per layer (x is the residual stream, f32[T, d_model]):
    h = rmsnorm(x, attn_norm);  q, k, v = qkv(h)
    q, k = NEOX RoPE (base `llama.rope.freq_base`; linear scaling and Llama 3's rope_freqs when present)
    x = x + o(attn(q, k, v))
    h = rmsnorm(x, ffn_norm)
    x = x + down(silu(gate(h)) * up(h))
No embedding scaling; the output projection is `output.weight`, or the embedding matrix when the file has none.
Attention scale 1/sqrt(head_dim); every layer global (llama.cpp runs this architecture without a window).

An int8 layer of two-term Linears (the shipped recipe) with plain RoPE also runs as one fused op over the paged
int8 KV cache (salon.kernels.decoder_block) where the kernel family has it; the composition below is its contract.

RoPE layout: llama.cpp rotates adjacent channel pairs (2i, 2i + 1) for this architecture, and its converter
permutes the rows of q and k (per head) so that Hugging Face's half-split rotation becomes that one. The
kernels here rotate halves (NEOX: pairs (i, i + D/2)), so the rows are permuted back at load -- the inverse
of the converter's permute -- and the two rotations give the same scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from salon.engine.model.config import LayerSpec, ModelConfig
from salon.engine.model.gguf_file import GGUFFile, GGUFMetadataError
from salon.engine.model.layers import Rotary, block_weights, fused_layer, linear_residual, norm_linear
from salon.engine.model.models.common import UnsupportedModelFile, attention_geometry, rope_linear_scale
from salon.engine.model.models.common import read_weights as read_named
from salon.engine.model.vocab import Vocab
from salon.kernels.decoder_block import BlockWeights

ARCH = "llama"
# No q/k norms: int8 key smoothing is folded into the k rows, its inverse into the q rows.
KEY_SMOOTHING = "qk_rows"
LAYER_NORMS = ("attn_norm", "ffn_norm")
# The int8 recipe (quantize.py, bench/quant_eval.py's table, docs/models.md): weights with one scale per output row
# and 32 input channels (weight_group, the grouped W8A8 contract of salon/kernels/w8a8_grouped.py), every activation
# as two int8 terms (linear.py) and no SmoothQuant smoothing -- measured on SmolLM2-135M, smoothing moves the
# activation error into the weights, and one weight scale per row (checkpoint format v8) keeps 257 of 263
# teacher-forced top-1 steps where a scale per 32 channels keeps 260 (the float32 path's 263 minus 3).
INT8_SMOOTH: tuple[str, ...] = ()
INT8_ACTIVATION_TERMS = 2
INT8_RECIPE: dict[str, object] = {"alpha": 0.5, "weight_group": 32}  # build_int8_checkpoint options
# The checkpoint's format tag (checkpoint.py): bumped when INT8_RECIPE changes, so old caches are converted again.
INT8_CHECKPOINT_FORMAT = "salon-int8-v9"  # v9: weights per row and 32 input channels (v8: per row)
# The Linears that take one int8 term per token and 32 channels (salon.kernels.w8a8_group32) under `--activations
# group32`, on the same checkpoint: the decoder layers' projections; the output projection is rescored (below).
INT8_GROUP32_RECIPE: tuple[str, ...] = ("qkv", "o", "gate_up", "down")
# The Linears the group32 recipe runs as group32 rescored (salon.kernels.linear_rescored): the output projection, whose
# greedy choice is then the two-term one's (its products halved: a decode step of several sequences is bound by them).
INT8_GROUP32_RESCORED: tuple[str, ...] = ("lm_head",)


def config_from_gguf(f: GGUFFile, model_id: str, sha256: str, vocab: Vocab) -> ModelConfig:
    d_model, num_heads, num_kv_heads, head_dim = attention_geometry(f, ARCH)
    if f.get_int(f"{ARCH}.expert_count", 0) > 0:
        raise UnsupportedModelFile(
            f"{f.path.name}: mixture-of-experts llama files ({ARCH}.expert_count = "
            f"{f.get_int(f'{ARCH}.expert_count')}) are not supported"
        )
    rope_dims = f.get_int(f"{ARCH}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UnsupportedModelFile(
            f"{f.path.name}: {ARCH}.rope.dimension_count {rope_dims} != head dim {head_dim} "
            "(partial rotary embeddings are not supported)"
        )
    num_layers = f.get_int(f"{ARCH}.block_count")
    base = f.get_float(f"{ARCH}.rope.freq_base", 10_000.0)
    scale = rope_linear_scale(f, ARCH)
    vocab_size = f.get_int(f"{ARCH}.vocab_size", len(vocab.tokens))
    if vocab_size != len(vocab.tokens):
        raise GGUFMetadataError(
            f"{f.path.name}: {ARCH}.vocab_size {vocab_size} but the tokenizer has {len(vocab.tokens)} tokens"
        )
    return ModelConfig(
        model_id=model_id,
        vocab_size=vocab_size,
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
        layers=tuple(LayerSpec("global", None, base, rope_position_scale=scale) for _ in range(num_layers)),
        attn_scale=1.0 / math.sqrt(head_dim),
        pad_token_id=vocab.pad_token_id,
        architecture=ARCH,
        activation="silu",
        qk_norm=False,
        post_norms=False,
        embedding_multiplier=1.0,
        tied_embeddings=not f.has_tensor("output"),
        add_bos=vocab.add_bos,
        rope_type_in_file="adjacent",
        weights_sha256=sha256,
    )


def weight_shapes(config: ModelConfig, with_rope_freqs: bool) -> dict[str, tuple[int, ...]]:
    d, hq, hkv, hd, ffn = config.d_model, config.num_heads, config.num_kv_heads, config.head_dim, config.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {"embed": (config.vocab_size, d), "final_norm": (d,)}
    if not config.tied_embeddings:
        shapes["lm_head"] = (config.vocab_size, d)
    if with_rope_freqs:
        shapes["rope_freqs"] = (hd // 2,)
    for i in range(config.num_layers):
        p = f"layers.{i}."
        shapes.update({p + n: (d,) for n in LAYER_NORMS})
        shapes.update(
            {
                p + "attn_q": (hq * hd, d),
                p + "attn_k": (hkv * hd, d),
                p + "attn_v": (hkv * hd, d),
                p + "attn_output": (d, hq * hd),
                p + "ffn_gate": (ffn, d),
                p + "ffn_up": (ffn, d),
                p + "ffn_down": (d, ffn),
            }
        )
    return shapes


def unpermute_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """GGUF q/k rows (adjacent-pair RoPE order) -> half-split order, per head: the inverse of llama.cpp's
    converter permute, which stores the row (head h, half c, index j < D/2) at (h, j, c), i.e. h*D + 2j + c."""
    rows, cols = w.shape
    head_dim = rows // num_heads
    return w.reshape(num_heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols).contiguous()


def read_weights(f: GGUFFile, config: ModelConfig) -> dict[str, torch.Tensor]:
    w = read_named(f, ARCH, weight_shapes(config, f.has_tensor("rope_freqs")))
    for i in range(config.num_layers):
        p = f"layers.{i}."
        w[p + "attn_q"] = unpermute_rows(w[p + "attn_q"], config.num_heads)
        w[p + "attn_k"] = unpermute_rows(w[p + "attn_k"], config.num_kv_heads)
    return w


@dataclass
class LlamaDecoderLayer:
    config: ModelConfig
    layer_idx: int
    rotary: Rotary
    kernel_ops: object
    attn_norm: torch.Tensor
    qkv: object  # Linear: d_model -> (Hq + 2*Hkv) * D
    o: object  # Linear: Hq * D -> d_model
    ffn_norm: torch.Tensor
    gate_up: object  # Linear with SwiGLU epilogue: d_model -> ffn_dim
    down: object  # Linear: ffn_dim -> d_model
    block: BlockWeights | None = None  # the layer as the fused op takes it (layers.block_weights), or None

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor:
        out = fused_layer(self.block, self.kernel_ops, self.layer_idx, x, attn)
        if out is not None:
            return out
        cfg = self.config
        eps = cfg.rms_norm_eps
        t, hq, hkv, d = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv = norm_linear(x, self.attn_norm, self.qkv, eps, self.kernel_ops)
        q = self.rotary(qkv[:, : hq * d].reshape(t, hq, d), positions)
        k = self.rotary(qkv[:, hq * d : (hq + hkv) * d].reshape(t, hkv, d), positions)
        v = qkv[:, (hq + hkv) * d :].reshape(t, hkv, d)
        x = linear_residual(attn(self.layer_idx, q, k, v).reshape(t, hq * d), self.o, x, eps, self.kernel_ops)
        h = norm_linear(x, self.ffn_norm, self.gate_up, eps, self.kernel_ops)
        return linear_residual(h, self.down, x, eps, self.kernel_ops)

    def nbytes(self) -> int:
        return sum(lin.nbytes() for lin in (self.qkv, self.o, self.gate_up, self.down)) + 4 * (
            self.attn_norm.numel() + self.ffn_norm.numel()
        )


def build_layer(config: ModelConfig, i: int, weights, kernel_ops) -> LlamaDecoderLayer:
    p = f"layers.{i}."
    spec = config.layers[i]
    rotary = Rotary(
        kernel_ops.rope_neox, config.head_dim, spec.rope_base, spec.rope_position_scale, weights.tensor("rope_freqs")
    )
    layer = LlamaDecoderLayer(
        config=config,
        layer_idx=i,
        rotary=rotary,
        kernel_ops=kernel_ops,
        attn_norm=weights.tensor(p + "attn_norm"),
        qkv=weights.linear(p + "qkv"),
        o=weights.linear(p + "o"),
        ffn_norm=weights.tensor(p + "ffn_norm"),
        gate_up=weights.linear(p + "gate_up", "silu"),
        down=weights.linear(p + "down"),
    )
    layer.block = block_weights(
        config, i, rotary, layer.attn_norm, layer.qkv, layer.o, layer.ffn_norm, layer.gate_up, layer.down
    )
    return layer
