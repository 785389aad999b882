"""The paged AttentionBackend the model calls once per layer (services.engine.model's protocol).

Per step it carries the batch metadata (ForwardBatch); per layer it writes the new K/V into the
layer's slot at its group's slots (ops.kv_write) and attends over the group's block tables
(ops.paged_attention). Layers that reuse another layer's KV (k is None) only attend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.paged_attention import PagedAttentionArgs
from services.engine.kv.kv_cache import KVCache


@dataclass(frozen=True)
class ForwardBatch:
    """Metadata of one step. T = scheduled tokens, S = sequences, one table per KV cache group."""

    token_ids: torch.Tensor  # int64[T]
    positions: torch.Tensor  # int64[T]
    query_start_loc: torch.Tensor  # int32[S + 1]
    seq_lens: torch.Tensor  # int32[S]: tokens of each sequence including this step's
    block_tables: list[torch.Tensor]  # per group: int32[S, max_blocks]
    slot_mappings: list[torch.Tensor]  # per group: int64[T]
    sample_rows: torch.Tensor  # int64[R]: rows whose hidden state is sampled
    row_seq: torch.Tensor | None = None  # int32[T]: each query row's sequence (built once per step, not per layer)
    max_query_tokens: int = 0  # the longest query run of a sequence (host side: no launcher reads it back)


class PagedAttention:
    def __init__(self, kv_cache: KVCache, kv_write: Callable, paged_attention: Callable, sm_scale: float) -> None:
        self.kv_cache = kv_cache
        self.kv_write = kv_write
        self.paged_attention = paged_attention
        self.sm_scale = sm_scale
        self.batch: ForwardBatch | None = None

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
        batch = self.batch
        assert batch is not None, "PagedAttention used outside a step"
        where = self.kv_cache.layout.layer_locations[layer_idx]
        cache = self.kv_cache.slots[where.slot]
        if k is not None:
            self.kv_write(k, v, cache.k_cache, cache.v_cache, cache.k_scale, cache.v_scale,
                          batch.slot_mappings[where.group_id])
        return self.paged_attention(PagedAttentionArgs(
            q, cache.k_cache, cache.v_cache, cache.k_scale, cache.v_scale, batch.block_tables[where.group_id],
            batch.query_start_loc, batch.seq_lens, self.sm_scale, where.sliding_window_tokens,
            batch.max_query_tokens or None, batch.row_seq,
        ))
