"""A whole pre-norm decoder layer (Gemma 3's or Llama's) over the paged int8 KV cache as one fused op, for
decode-sized steps.

A decode step runs each layer as about twenty kernel calls (two-term Linears, q/k norm and RoPE, the KV write,
paged attention, the gated activation), each a few microseconds of Python, and between them the GEMMs' threads
go idle. The fused op runs the layer as one call. Its contract is the model's own composition of the kernel
family's ops (salon/engine/model/models/gemma3.py, llama.py): where a family has the op it gives that
composition's bits, and where it cannot (or a family has none, `no_decoder_block`) it returns None and the
model composes.

    decoder_block(x f32[T, d_model], weights: BlockWeights, cache: BlockCache, batch: BlockBatch)
        -> f32[T, d_model] | None        (a new tensor; x is not changed)

    decoder_blocks(x f32[T, d_model], layers: Sequence[(BlockWeights, BlockCache, BlockBatch)])
        -> (f32[T, d_model], n)          (the step's layers in order, as decoder_block would run them one by
                                          one, in one call: n of them were done, stopping at the first the op
                                          does not take; the output of layer n - 1, a new tensor, or x itself
                                          when n = 0)

The three holders are plain tensors and numbers: the layer's weights (built once with the model), the
layer's KV cache slot (once per cache), and the step's rows for the layer's KV cache group (once per step and
group, by the attention backend). Identity is what matters (eq=False): a family may keep what it derives from
one (e.g. the C structs of salon/kernels/cpu/decoder_block.py) for as long as that object lives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class BlockWeights:
    """One layer: norms f32[d_model] (q_norm, k_norm f32[head_dim]: Gemma's per-head norms; None where the
    architecture has none, as the post-norms); each Linear as int8 w[N, K] with two-term activations (or one
    int16 term, int16_activations: salon.kernels.w16a8_grouped; or one int8 term per token and 32 channels,
    group32_activations: salon.kernels.w8a8_group32) and f32 scales [N, K / 32] (the grouped contract) or
    [N] (one per row; two terms only); qkv's N is (Hq + 2 Hkv) * head_dim, or
    Hq * head_dim where the layer reads another layer's KV (writes_kv False); gate_up's rows are the gate, then
    the up projection, with `activation` "gelu_tanh" (GeGLU) or "silu" (SwiGLU)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_dim: int
    eps: float
    sm_scale: float
    sliding_window: int | None  # None: global attention
    rope_base: float  # plain NeoX RoPE of this base (no position scaling)
    writes_kv: bool
    activation: str
    attn_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_attention_norm: torch.Tensor | None
    ffn_norm: torch.Tensor
    post_ffw_norm: torch.Tensor | None
    qkv_w: torch.Tensor
    qkv_s: torch.Tensor
    o_w: torch.Tensor
    o_s: torch.Tensor
    gate_up_w: torch.Tensor
    gate_up_s: torch.Tensor
    down_w: torch.Tensor
    down_s: torch.Tensor
    int16_activations: bool = False
    group32_activations: bool = False


@dataclass(frozen=True, eq=False)
class BlockCache:
    """The layer's paged KV cache slot: int8 k/v [num_blocks, block_size, Hkv, D], f32 scales
    [num_blocks, block_size, Hkv]."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor


@dataclass(frozen=True, eq=False)
class BlockBatch:
    """A step's T query rows for one KV cache group, grouped by sequence in order (S sequences)."""

    positions: torch.Tensor  # int64[T]
    max_position: int  # the largest of positions (host side: what the RoPE tables must cover)
    slot_mapping: torch.Tensor  # int64[T]: the group's cache slot of each row's k/v
    block_tables: torch.Tensor  # int32[S, max_blocks]
    query_start_loc: torch.Tensor  # int32[S + 1]
    seq_lens: torch.Tensor  # int32[S]
    row_seq: torch.Tensor  # int32[T]: each row's sequence


def no_decoder_block(x: torch.Tensor, weights: BlockWeights, cache: BlockCache, batch: BlockBatch) -> None:
    """The op of a family without a fused layer: always declines (the model composes)."""
    return None


def decoder_block_triton(x: torch.Tensor, weights: BlockWeights, cache: BlockCache, batch: BlockBatch) -> None:
    """The Triton family has no fused layer (a GPU step's launches are cheap beside its GEMMs): it declines."""
    return None


def no_decoder_blocks(
    x: torch.Tensor, layers: Sequence[tuple[BlockWeights, BlockCache, BlockBatch]]
) -> tuple[torch.Tensor, int]:
    """The op of a family without a fused layer: does none of the layers (the model composes them)."""
    return x, 0


def decoder_blocks_triton(
    x: torch.Tensor, layers: Sequence[tuple[BlockWeights, BlockCache, BlockBatch]]
) -> tuple[torch.Tensor, int]:
    """The Triton family has no fused layer (decoder_block_triton): it does none of the layers."""
    return x, 0
