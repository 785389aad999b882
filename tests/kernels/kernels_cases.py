"""Builders of test inputs shared by the kernel tests (paged KV caches with hostile block tables)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from salon.kernels.kv_write import kv_write_ref
from salon.kernels.paged_attention import PagedAttentionArgs

# Awkward paged-attention batches shared by the reference and kernel tests.
PAGED_CASES = {
    # name: (seq_lens, q_lens, Hq, Hkv, D, block_size, window)
    "one_token_context": ([1], [1], 2, 1, 8, 4, None),
    "decode_batch_mqa": ([1, 5, 16, 17, 30], [1, 1, 1, 1, 1], 4, 1, 8, 4, None),
    "decode_window_cuts_block": ([23, 9, 6], [1, 1, 1], 4, 1, 8, 4, 6),
    "prefill_full": ([13], [13], 3, 1, 16, 4, None),
    "prefill_window": ([13, 21], [13, 21], 2, 1, 8, 4, 5),
    "chunked_prefill_gqa": ([19, 8, 33], [7, 8, 2], 4, 2, 8, 4, 9),
    "mixed_with_empty_query": ([12, 7, 25], [0, 3, 1], 2, 2, 8, 8, 10),
    "window_of_one": ([9, 4], [3, 1], 2, 1, 8, 4, 1),
}


@dataclass
class PagedCase:
    q: torch.Tensor  # f32[T, Hq, D]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    block_tables: torch.Tensor  # int32[S, max_blocks]
    query_start_loc: torch.Tensor  # int32[S + 1]
    seq_lens: torch.Tensor  # int32[S]
    sm_scale: float
    sliding_window: int | None
    dense_k: list[torch.Tensor]  # per sequence, dequantized f32[L, Hkv, D], built without the block table
    dense_v: list[torch.Tensor]

    def args(self) -> PagedAttentionArgs:
        return PagedAttentionArgs(
            self.q,
            self.k_cache,
            self.v_cache,
            self.k_scale,
            self.v_scale,
            self.block_tables,
            self.query_start_loc,
            self.seq_lens,
            self.sm_scale,
            self.sliding_window,
        )

    def as_float(self, dtype: torch.dtype) -> PagedCase:
        """The same case over a float cache (no scales) holding the int8 cache's dequantized values, rounded
        to dtype; dense_k / dense_v are rounded the same way, so dense_attention stays the exact answer."""
        k = (self.k_cache.float() * self.k_scale[..., None]).to(dtype)
        v = (self.v_cache.float() * self.v_scale[..., None]).to(dtype)
        return PagedCase(
            **{
                **vars(self),
                "k_cache": k,
                "v_cache": v,
                "k_scale": None,
                "v_scale": None,
                "dense_k": [x.to(dtype).float() for x in self.dense_k],
                "dense_v": [x.to(dtype).float() for x in self.dense_v],
            }
        )

    def to(self, device: str) -> PagedCase:
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()}
        return PagedCase(**moved)


def make_paged_case(
    seq_lens: list[int],
    q_lens: list[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    sliding_window: int | None,
    seed: int,
    spare_blocks: int = 3,
    extra_table_cols: int = 2,
    poison: str = "out_of_range",
) -> PagedCase:
    """Random paged cache in shuffled blocks. Table entries no query may read hold a poison id:
    "out_of_range" (an id past the cache: reading it fails or yields garbage) or "nan_block" (a real block
    whose scales are NaN: any use of it, even with zero attention weight, turns the output into NaN)."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=g).tolist()
    poison = num_blocks + 1000 if poison == "out_of_range" else order.pop(0)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    # Unwritten slots hold noise too, so reading a slot past the end would show.
    k_cache = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
    v_cache = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
    k_scale = torch.rand(shape[:3], generator=g) + 0.5
    v_scale = torch.rand(shape[:3], generator=g) + 0.5
    max_blocks = max(blocks_per_seq) + extra_table_cols
    tables = torch.full((len(seq_lens), max_blocks), poison, dtype=torch.int32)
    dense_k, dense_v, queries = [], [], []
    for s, (seq_len, q_len) in enumerate(zip(seq_lens, q_lens)):
        ids = torch.tensor([order.pop() for _ in range(blocks_per_seq[s])], dtype=torch.int64)
        first_pos = seq_len - q_len
        lo = 0 if sliding_window is None else max(0, first_pos - sliding_window + 1)
        needed = torch.arange(blocks_per_seq[s]) >= lo // block_size
        tables[s, : blocks_per_seq[s]] = torch.where(needed, ids, torch.full_like(ids, poison)).to(torch.int32)
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=g)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=g)
        positions = torch.arange(seq_len)
        slots = ids[positions // block_size] * block_size + positions % block_size
        kv_write_ref(k, v, k_cache, v_cache, k_scale, v_scale, slots)
        dense_k.append(
            k_cache.view(-1, num_kv_heads, head_dim)[slots].float() * k_scale.view(-1, num_kv_heads)[slots][..., None]
        )
        dense_v.append(
            v_cache.view(-1, num_kv_heads, head_dim)[slots].float() * v_scale.view(-1, num_kv_heads)[slots][..., None]
        )
        queries.append(torch.randn(q_len, num_q_heads, head_dim, generator=g))
    if poison < num_blocks:
        k_scale[poison] = float("nan")
        v_scale[poison] = float("nan")
    query_start_loc = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return PagedCase(
        q=torch.cat(queries),
        k_cache=k_cache,
        v_cache=v_cache,
        k_scale=k_scale,
        v_scale=v_scale,
        block_tables=tables,
        query_start_loc=query_start_loc,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        sm_scale=head_dim**-0.5,
        sliding_window=sliding_window,
        dense_k=dense_k,
        dense_v=dense_v,
    )


def dense_attention(case: PagedCase) -> torch.Tensor:
    """Independent check: SDPA over each sequence's contiguous dequantized K/V with an explicit mask."""
    out = torch.zeros_like(case.q)
    starts = case.query_start_loc.tolist()
    for s, seq_len in enumerate(case.seq_lens.tolist()):
        q = case.q[starts[s] : starts[s + 1]]
        if q.shape[0] == 0:
            continue
        q_pos = torch.arange(seq_len - q.shape[0], seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        mask = k_pos <= q_pos
        if case.sliding_window is not None:
            mask &= q_pos - k_pos < case.sliding_window
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).double(),
            case.dense_k[s].transpose(0, 1).double(),
            case.dense_v[s].transpose(0, 1).double(),
            attn_mask=mask,
            scale=case.sm_scale,
            enable_gqa=True,
        )
        out[starts[s] : starts[s + 1]] = o.transpose(0, 1).float()
    return out
