"""Layers the architectures share: the token embedding, rotary position embedding, RMSNorm -> Linear, and a
decoder layer as the fused op takes it (salon.kernels.decoder_block).

Every architecture file (models/*.py) is written with these and the Linear classes (linear.py); the
precision lives entirely in the Linear objects and the embedding table.
"""

from __future__ import annotations

import torch

from salon.engine.model.config import ModelConfig
from salon.engine.model.linear import Int8Linear, dequantize_weight
from salon.kernels.backend import Ops
from salon.kernels.decoder_block import BlockWeights
from salon.kernels.rope import rope_inv_freq


class Embedding:
    """Token table: float32 rows, or int8 rows with one float32 scale per row (row_scale f32[V]) or per row and
    group of GROUP channels (f32[V, d_model / GROUP], the grid of a grouped tied output projection).

    channel_scale (f32[d_model], optional) multiplies every looked-up row: a tied table that holds E * s
    for the output projection's smoothing (quantize.py) gives back E at lookup.
    """

    def __init__(
        self, table: torch.Tensor, row_scale: torch.Tensor | None = None, channel_scale: torch.Tensor | None = None
    ) -> None:
        self.table = table
        self.row_scale = row_scale
        self.channel_scale = channel_scale

    def lookup(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.row_scale is not None:
            rows = dequantize_weight(self.table[token_ids], self.row_scale[token_ids])
        else:
            rows = self.table[token_ids].to(torch.float32)
        if self.channel_scale is not None:
            rows = rows * self.channel_scale[None, :]
        return rows

    def nbytes(self) -> int:
        extra = 0 if self.row_scale is None else self.row_scale.numel() * 4
        extra += 0 if self.channel_scale is None else self.channel_scale.numel() * 4
        return self.table.numel() * self.table.element_size() + extra


class Rotary:
    """NeoX-layout RoPE (channel pairs (i, i + D/2)) with one layer's base.

    Plain RoPE runs the kernel op (salon.kernels.rope semantics). With linear scaling (angle from
    position * position_scale) or per-pair frequency factors (Llama 3's rope_freqs: inv_freq[i] / factor[i])
    the same formula runs here in float32.
    """

    def __init__(
        self,
        kernel_rope,
        head_dim: int,
        base: float,
        position_scale: float = 1.0,
        freq_factors: torch.Tensor | None = None,
        kernel_ops: Ops | None = None,
    ) -> None:
        self.kernel_rope = kernel_rope
        self.kernel_ops = kernel_ops  # for norm_rope: the family's rmsnorm and rmsnorm_rope
        self.base = base
        self.plain = position_scale == 1.0 and freq_factors is None
        inv_freq = rope_inv_freq(head_dim, base)
        if freq_factors is not None:
            inv_freq = inv_freq / freq_factors.to(torch.float32)
        self.inv_freq = inv_freq
        self.position_scale = position_scale

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x f32[T, H, D], positions int64[T] -> f32[T, H, D]."""
        if self.plain:
            return self.kernel_rope(x, positions, self.base)
        half = x.shape[-1] // 2
        pos = positions.to(torch.float32) * self.position_scale
        angle = pos[:, None] * self.inv_freq.to(x.device)[None, :]
        cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def norm_rope(
        self, x: torch.Tensor, norm_weight: torch.Tensor, eps: float, positions: torch.Tensor
    ) -> torch.Tensor:
        """self(rmsnorm(x, norm_weight)) per head (Gemma's q/k norms): plain RoPE runs both as the kernel
        family's one rmsnorm_rope op."""
        if self.plain:
            return self.kernel_ops.rmsnorm_rope(x, norm_weight, eps, positions, self.base)
        return self(self.kernel_ops.rmsnorm(x, norm_weight, eps), positions)


def norm_rope_kv(
    rotary: Rotary,
    kernel_ops: Ops,
    attn,
    layer_idx: int,
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Gemma's q and k per-head norms and RoPE: (q, k, v) for attn(layer_idx, q, k, v). With plain RoPE the family's
    one rmsnorm_rope_kv op runs them, and where the backend hands out the layer's paged int8 cache (block_kv) it
    writes k and v there itself, so k = v = None go to the backend, which then only attends (a layer's KV is
    written once). k = None: a layer that reads another layer's KV."""
    if rotary.plain:
        if k is None:
            return kernel_ops.rmsnorm_rope_kv(q, None, None, q_norm, None, eps, positions, rotary.base), None, None
        paged = attn.block_kv(layer_idx)
        if paged is not None:
            cache, rows = paged
            q = kernel_ops.rmsnorm_rope_kv(
                q,
                k,
                v,
                q_norm,
                k_norm,
                eps,
                positions,
                rotary.base,
                cache.k_cache,
                cache.v_cache,
                cache.k_scale,
                cache.v_scale,
                rows.slot_mapping,
            )
            return q, None, None
    q = rotary.norm_rope(q, q_norm, eps, positions)
    return q, None if k is None else rotary.norm_rope(k, k_norm, eps, positions), v


def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, linear, eps: float, kernel_ops: Ops) -> torch.Tensor:
    """linear(rmsnorm(x)); int8 layers take the fused rmsnorm_quant kernel's output directly, fused ones (two
    int8 terms, one int16 term, group32) run the norm inside their op."""
    if isinstance(linear, Int8Linear) and linear.fuses():
        return linear.fused(x, norm_weight=norm_weight, eps=eps)
    if isinstance(linear, Int8Linear) and linear.quantize_activations and linear.activation_terms == 1:
        return linear.from_quantized(*kernel_ops.rmsnorm_quant(x, norm_weight, eps))
    return linear(kernel_ops.rmsnorm(x, norm_weight, eps))


def linear_residual(
    x: torch.Tensor, linear, residual: torch.Tensor, eps: float, kernel_ops: Ops, post_norm: torch.Tensor | None = None
) -> torch.Tensor:
    """residual + linear(x), with rmsnorm(., post_norm) on the Linear's output where given; two-term int8
    layers (two int8 terms, one int16 term, group32) run all of it as their one op."""
    if isinstance(linear, Int8Linear) and linear.fuses() and not linear.gate_activation:
        return linear.fused(x, eps=eps, post_norm=post_norm, residual=residual)
    out = linear(x)
    if post_norm is not None:
        out = kernel_ops.rmsnorm(out, post_norm, eps)
    return residual + out


def block_weights(
    config: ModelConfig,
    layer_idx: int,
    rotary: Rotary,
    attn_norm: torch.Tensor,
    qkv,
    o,
    ffn_norm: torch.Tensor,
    gate_up,
    down,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    post_attention_norm: torch.Tensor | None = None,
    post_ffw_norm: torch.Tensor | None = None,
) -> BlockWeights | None:
    """A pre-norm decoder layer as salon.kernels.decoder_block takes it -- four fused int8 Linears of one activation
    recipe with the same kind of weight scales, a GeGLU or SwiGLU gate and plain RoPE -- or None (the layer
    always composes its ops)."""
    linears = (qkv, o, gate_up, down)
    if (
        not all(isinstance(lin, Int8Linear) and lin.fuses() for lin in linears)
        or len({(lin.w_scale.dim(), lin.int16_activations, lin.group32_activations) for lin in linears}) != 1
        or gate_up.gate_activation not in ("gelu_tanh", "silu")
        or not rotary.plain
    ):
        return None
    spec = config.layers[layer_idx]
    return BlockWeights(
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        ffn_dim=config.ffn_dim,
        eps=config.rms_norm_eps,
        sm_scale=config.attn_scale,
        sliding_window=spec.sliding_window_tokens,
        rope_base=rotary.base,
        writes_kv=spec.kv_source_layer is None,
        activation=gate_up.gate_activation,
        attn_norm=attn_norm,
        q_norm=q_norm,
        k_norm=k_norm,
        post_attention_norm=post_attention_norm,
        ffn_norm=ffn_norm,
        post_ffw_norm=post_ffw_norm,
        qkv_w=qkv.w_q,
        qkv_s=qkv.w_scale,
        o_w=o.w_q,
        o_s=o.w_scale,
        gate_up_w=gate_up.w_q,
        gate_up_s=gate_up.w_scale,
        down_w=down.w_q,
        down_s=down.w_scale,
        int16_activations=qkv.int16_activations,
        group32_activations=qkv.group32_activations,
    )


def fused_layers(layers, kernel_ops: Ops, x: torch.Tensor, attn) -> tuple[torch.Tensor, int]:
    """The step's first n layers from the family's one call for them (salon.kernels.decoder_block's decoder_blocks):
    (their output, n), where n counts the layers from the first on that the layer, the family and the attention
    backend take (the composition's bits); the model runs layers n.. itself."""
    taken = []
    for layer in layers:
        paged = None if layer.block is None else attn.block_kv(layer.layer_idx)
        if paged is None:
            break
        taken.append((layer.block, *paged))
    return kernel_ops.decoder_blocks(x, taken) if taken else (x, 0)


def fused_layer(
    block: BlockWeights | None, kernel_ops: Ops, layer_idx: int, x: torch.Tensor, attn
) -> torch.Tensor | None:
    """The layer's output from the family's fused op where the layer, the family and the attention backend take
    it (the composition's bits); None: the layer composes its ops."""
    if block is None:
        return None
    paged = attn.block_kv(layer_idx)
    return None if paged is None else kernel_ops.decoder_block(x, block, *paged)
