"""The attention interface the model calls, and DenseAttention: contiguous per-sequence KV.

The model hands each layer's q (q-norm and RoPE applied) and, for KV-producing layers, k/v to the
backend; layers that share KV pass k = v = None and the backend reads the source layer's KV. A backend over
the paged int8 cache also hands out, per layer, what a fused decoder layer (salon.kernels.decoder_block) reads
instead (`block_kv`); DenseAttention has none.
DenseAttention keeps every sequence's KV contiguously from position 0 (float, or int8 with one
float32 scale per token per KV head, emulated as quantize -> dequantize on write). It is the
backend of the quality gates, perplexity and the model benchmark; the serving path uses paged KV.

Query rows of one call are grouped by sequence, in order: rows [0, n_0) belong to sequence 0, ...
Each new token is appended to its sequence at position = tokens already cached.
"""

from __future__ import annotations

from typing import Protocol

import torch

from salon.engine.model.config import ModelConfig
from salon.engine.model.ops import quantize_symmetric
from salon.kernels.decoder_block import BlockBatch, BlockCache


class AttentionBackend(Protocol):
    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None
    ) -> torch.Tensor: ...

    def block_kv(self, layer_idx: int) -> tuple[BlockCache, BlockBatch] | None:
        """The layer's KV cache slot and this step's rows for it, for a fused decoder layer; None: the layer
        composes its ops and calls the backend."""


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Plain masked attention for one sequence: q[T, Hq, D], k/v[L, Hkv, D] -> [T, Hq, D].

    Key at position j is visible to the query at position p iff j <= p and (no window or p - j < W).
    """
    t, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    qh = q.reshape(t, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * t, d)
    scores = torch.bmm(qh, k.permute(1, 2, 0)) * sm_scale  # [Hkv, G*T, L]
    visible = k_positions[None, :] <= q_positions[:, None]
    if sliding_window is not None:
        visible &= (q_positions[:, None] - k_positions[None, :]) < sliding_window
    scores = scores.masked_fill(~visible.repeat(group, 1)[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.bmm(probs, v.permute(1, 0, 2))  # [Hkv, G*T, D]
    return out.reshape(hkv, group, t, d).permute(2, 0, 1, 3).reshape(t, hq, d)


class _SeqCache:
    """Growable contiguous K/V of one sequence for one KV-producing layer."""

    def __init__(self, num_kv_heads: int, head_dim: int) -> None:
        self.k = torch.empty(0, num_kv_heads, head_dim)
        self.v = torch.empty(0, num_kv_heads, head_dim)
        self.num_tokens = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        need = self.num_tokens + k.shape[0]
        if need > self.k.shape[0]:
            cap = max(need, 2 * self.k.shape[0], 64)
            for name in ("k", "v"):
                old = getattr(self, name)
                new = torch.empty(cap, *old.shape[1:])
                new[: self.num_tokens] = old[: self.num_tokens]
                setattr(self, name, new)
        self.k[self.num_tokens : need] = k
        self.v[self.num_tokens : need] = v
        self.num_tokens = need


def fake_quantize_kv(x: torch.Tensor) -> torch.Tensor:
    """int8 KV emulation: per token per KV head over head_dim, stored as int8 + f32 scale."""
    q, scale = quantize_symmetric(x, dim=-1)
    return q.to(torch.float32) * scale[..., None]


class DenseAttention:
    def __init__(self, config: ModelConfig, num_seqs: int = 1, kv_int8: bool = False) -> None:
        self.config = config
        self.kv_int8 = kv_int8
        self.sm_scale = config.attn_scale
        self._caches = [
            {layer: _SeqCache(config.num_kv_heads, config.head_dim) for layer in config.kv_layers()}
            for _ in range(num_seqs)
        ]
        self._query_lens = [0] * num_seqs
        # Position of each sequence's first new row in the current step, set by begin_step().
        self._start_positions = [0] * num_seqs

    @property
    def num_seqs(self) -> int:
        return len(self._caches)

    def seq_len(self, seq: int) -> int:
        return self._caches[seq][self.config.kv_layers()[0]].num_tokens

    def begin_step(self, query_lens: list[int]) -> torch.Tensor:
        """Declare how many new tokens each sequence brings; returns their positions (row order)."""
        if len(query_lens) != self.num_seqs:
            raise ValueError("one query length per sequence")
        self._query_lens = list(query_lens)
        self._start_positions = [self.seq_len(s) for s in range(self.num_seqs)]
        return torch.cat([torch.arange(p, p + n) for p, n in zip(self._start_positions, query_lens)])

    def block_kv(self, layer_idx: int) -> None:
        return None  # contiguous float KV: no fused layer reads it

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
        spec = self.config.layers[layer_idx]
        src = self.config.kv_source(layer_idx)
        out = torch.empty_like(q)
        row = 0
        for s, n in enumerate(self._query_lens):
            cache = self._caches[s][src]
            if k is not None:
                ks, vs = k[row : row + n], v[row : row + n]
                if self.kv_int8:
                    ks, vs = fake_quantize_kv(ks), fake_quantize_kv(vs)
                cache.append(ks, vs)
            start = self._start_positions[s]
            q_pos = torch.arange(start, start + n)
            length = cache.num_tokens
            first = 0 if spec.sliding_window_tokens is None else max(0, start - spec.sliding_window_tokens + 1)
            k_pos = torch.arange(first, length)
            out[row : row + n] = attend(
                q[row : row + n],
                cache.k[first:length],
                cache.v[first:length],
                q_pos,
                k_pos,
                self.sm_scale,
                spec.sliding_window_tokens,
            )
            row += n
        return out

    def kv_bytes_per_token(self) -> int:
        return self.config.kv_bytes_per_token(1.0 if self.kv_int8 else 4.0, 4 if self.kv_int8 else 0)
