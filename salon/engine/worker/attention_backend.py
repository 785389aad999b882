"""The paged AttentionBackend the model calls once per layer (salon.engine.model's protocol).

Per step it carries the batch metadata (ForwardBatch); per layer it writes the new K/V into the
layer's slot at its group's slots (ops.kv_write) and attends over the group's block tables
(ops.paged_attention). Layers that reuse another layer's KV (k is None) only attend. For a fused decoder
layer (salon.kernels.decoder_block) it hands out the layer's cache slot (one holder per slot, kept) and the step's
rows for the layer's group (one holder per group and step), int8 caches only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from salon.engine.kv.kv_cache import KVCache
from salon.kernels.decoder_block import BlockBatch, BlockCache
from salon.kernels.paged_attention import PagedAttentionArgs


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
    max_position: int = 0  # the largest of positions (host side)


class PagedAttention:
    def __init__(self, kv_cache: KVCache, kv_write: Callable, paged_attention: Callable, sm_scale: float) -> None:
        self.kv_cache = kv_cache
        self.kv_write = kv_write
        self.paged_attention = paged_attention
        self.sm_scale = sm_scale
        self.batch: ForwardBatch | None = None
        self._block_caches: dict[int, BlockCache] = {}  # cache slot -> its holder
        self._block_batches: dict[int, BlockBatch] = {}  # group -> this step's holder
        self._block_batches_of: ForwardBatch | None = None  # the step they belong to

    def block_kv(self, layer_idx: int) -> tuple[BlockCache, BlockBatch] | None:
        batch = self.batch
        assert batch is not None, "PagedAttention used outside a step"
        where = self.kv_cache.layout.layer_locations[layer_idx]
        cache = self.kv_cache.slots[where.slot]
        if cache.k_scale is None or cache.v_scale is None or batch.row_seq is None:
            return None
        held = self._block_caches.get(where.slot)
        if held is None:
            held = self._block_caches[where.slot] = BlockCache(
                cache.k_cache, cache.v_cache, cache.k_scale, cache.v_scale
            )
        if self._block_batches_of is not batch:
            self._block_batches, self._block_batches_of = {}, batch
        rows = self._block_batches.get(where.group_id)
        if rows is None:
            g = where.group_id
            rows = self._block_batches[g] = BlockBatch(
                batch.positions,
                batch.max_position,
                batch.slot_mappings[g],
                batch.block_tables[g],
                batch.query_start_loc,
                batch.seq_lens,
                batch.row_seq,
            )
        return held, rows

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
        batch = self.batch
        assert batch is not None, "PagedAttention used outside a step"
        where = self.kv_cache.layout.layer_locations[layer_idx]
        cache = self.kv_cache.slots[where.slot]
        if k is not None:
            self.kv_write(
                k, v, cache.k_cache, cache.v_cache, cache.k_scale, cache.v_scale, batch.slot_mappings[where.group_id]
            )
        return self.paged_attention(
            PagedAttentionArgs(
                q,
                cache.k_cache,
                cache.v_cache,
                cache.k_scale,
                cache.v_scale,
                batch.block_tables[where.group_id],
                batch.query_start_loc,
                batch.seq_lens,
                self.sm_scale,
                where.sliding_window_tokens,
                batch.max_query_tokens or None,
                batch.row_seq,
            )
        )
