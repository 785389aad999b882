"""Gemma-3-style decoder (the architecture of ModelConfig), one code path for both precisions.

Per layer (x is the residual stream, f32[T, d_model]):
    h = rmsnorm(x, attn_norm);  q, k, v = qkv(h)            (sharing layers compute q only)
    q, k = per-head rmsnorm(q_norm / k_norm), NEOX RoPE (layer's base)
    x = x + rmsnorm(o(attn(q, k, v)), post_attention_norm)
    h = rmsnorm(x, ffn_norm)
    x = x + rmsnorm(down(gelu_tanh(gate(h)) * up(h)), post_ffw_norm)
Embeddings are scaled by sqrt(d_model); the output projection is the (tied) embedding matrix.
Precision lives entirely in the Linear objects and the embedding table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.backend import Ops
from services.engine.model import ops
from services.engine.model.attention import AttentionBackend
from services.engine.model.config import ModelConfig
from services.engine.model.linear import Int8Linear


@dataclass
class LayerWeights:
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


class Embedding:
    """Token table: float32 rows, or int8 rows with one float32 scale per row."""

    def __init__(self, table: torch.Tensor, row_scale: torch.Tensor | None = None) -> None:
        self.table = table
        self.row_scale = row_scale

    def lookup(self, token_ids: torch.Tensor) -> torch.Tensor:
        rows = self.table[token_ids].to(torch.float32)
        if self.row_scale is not None:
            rows = rows * self.row_scale[token_ids][:, None]
        return rows

    def nbytes(self) -> int:
        extra = 0 if self.row_scale is None else self.row_scale.numel() * 4
        return self.table.numel() * self.table.element_size() + extra


class CausalLM:
    def __init__(self, config: ModelConfig, embed: Embedding, layers: list[LayerWeights],
                 final_norm: torch.Tensor, lm_head: object, precision: str, kernel_ops: Ops) -> None:
        self.config = config
        self.embed = embed
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head  # Linear d_model -> vocab (shares storage with the embedding table)
        self.precision = precision
        self.kernel_ops = kernel_ops
        self._embed_scale = torch.tensor(math.sqrt(config.d_model), dtype=torch.float32)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        """token_ids, positions: int64[T] -> hidden f32[T, d_model] (final norm applied)."""
        cfg = self.config
        x = self.embed.lookup(token_ids) * self._embed_scale
        for idx, lw in enumerate(self.layers):
            x = self._layer(idx, lw, x, positions, attn)
        return ops.rmsnorm(x, self.final_norm, cfg.rms_norm_eps)

    def _layer(self, idx: int, lw: LayerWeights, x: torch.Tensor, positions: torch.Tensor,
               attn: AttentionBackend) -> torch.Tensor:
        cfg = self.config
        spec = cfg.layers[idx]
        t, hq, hkv, d = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        rope = self.kernel_ops.rope_neox
        qkv = self._norm_linear(x, lw.attn_norm, lw.qkv)
        q = ops.rmsnorm(qkv[:, : hq * d].reshape(t, hq, d), lw.q_norm, cfg.rms_norm_eps)
        q = rope(q, positions, spec.rope_base)
        k = v = None
        if spec.kv_source_layer is None:
            k = ops.rmsnorm(qkv[:, hq * d: (hq + hkv) * d].reshape(t, hkv, d), lw.k_norm, cfg.rms_norm_eps)
            k = rope(k, positions, spec.rope_base)
            v = qkv[:, (hq + hkv) * d:].reshape(t, hkv, d)
        o = attn(idx, q, k, v)
        x = x + ops.rmsnorm(lw.o(o.reshape(t, hq * d)), lw.post_attention_norm, cfg.rms_norm_eps)
        f = lw.down(self._norm_linear(x, lw.ffn_norm, lw.gate_up))
        return x + ops.rmsnorm(f, lw.post_ffw_norm, cfg.rms_norm_eps)

    def _norm_linear(self, x: torch.Tensor, norm_weight: torch.Tensor, linear) -> torch.Tensor:
        """linear(rmsnorm(x)); int8 layers take the fused rmsnorm_quant kernel's output directly."""
        eps = self.config.rms_norm_eps
        if isinstance(linear, Int8Linear) and linear.quantize_activations:
            return linear.from_quantized(*self.kernel_ops.rmsnorm_quant(x, norm_weight, eps))
        return linear(ops.rmsnorm(x, norm_weight, eps))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden f32[R, d_model] -> logits f32[R, vocab] (no soft-capping)."""
        return self.lm_head(hidden)

    def weight_bytes(self) -> int:
        total = self.embed.nbytes() + self.final_norm.numel() * 4
        for lw in self.layers:
            total += sum(lin.nbytes() for lin in (lw.qkv, lw.o, lw.gate_up, lw.down))
            total += sum(t.numel() * 4 for t in (lw.attn_norm, lw.q_norm, lw.post_attention_norm, lw.ffn_norm,
                                                 lw.post_ffw_norm) if t is not None)
        return total
