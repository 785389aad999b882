"""Attention of new query tokens over a paged int8 KV cache (prefill, chunked prefill and decode alike).

Addressing:
    block_tables[s, i]   cache block holding key positions [i * BS, (i + 1) * BS) of sequence s
    query rows of s      [query_start_loc[s], query_start_loc[s + 1]), q_len_s rows
    query j of s         sits at position seq_lens[s] - q_len_s + j (its own K/V is already in the cache)
Visibility: the query at position p sees key k iff k <= p and (no window or p - k < W).
Table entries of blocks that no query of the sequence can see (wholly before the window, or past the end)
may hold any id, so no implementation may read them.
A sequence of length 0 with one query row (a padded row of a fixed-size decode batch) sees no key: every
implementation gives it zeros and reads no cache entry. A block table wider than its sequences need (the
engine's fixed-width tables) changes no row's bits: the decode kernel's split count follows the table's width,
and it merges only the splits a row's keys fall in.
Query head h reads KV head h // (Hq / Hkv). K/V are dequantized as int8 * per-(token, head) scale;
float caches (bfloat16 / float32, k_scale = v_scale = None) are read as they are.

Every implementation (`paged_attention_ref` here, `paged_attention_triton` below, `paged_attention_cpu`
in salon/kernels/cpu/) takes one PagedAttentionArgs and returns f32[T, Hq, D].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from salon.kernels.triton_launch import check, check_tensor, is_interpreted, next_pow2, on_device


@dataclass(frozen=True)
class PagedAttentionArgs:
    """One layer's attention call. T = query rows, S = sequences, NB = cache blocks, BS = block size."""

    q: torch.Tensor  # f32[T, Hq, D], RoPE applied
    k_cache: torch.Tensor  # int8[NB, BS, Hkv, D], or bf16/f32 for float caches
    v_cache: torch.Tensor  # same shape and dtype as k_cache
    k_scale: torch.Tensor | None  # f32[NB, BS, Hkv] for int8 caches, else None
    v_scale: torch.Tensor | None
    block_tables: torch.Tensor  # int32[S, max_blocks]
    query_start_loc: torch.Tensor  # int32[S + 1]
    seq_lens: torch.Tensor  # int32[S]: tokens of each sequence including this call's queries
    sm_scale: float
    sliding_window: int | None
    # The longest query run of any sequence, known on the host when the batch is built (the engine passes
    # it so that no launcher reads query_start_loc back from the device); None: computed from the tensors.
    max_query_tokens: int | None = None
    # int32[T]: the sequence of each query row (the engine builds it once per step); None: from query_start_loc.
    row_seq: torch.Tensor | None = None


def visible_key_range(position: int, seq_len: int, sliding_window: int | None) -> tuple[int, int]:
    """Half-open key-position range [lo, hi) seen by the query at `position`."""
    lo = 0 if sliding_window is None else max(0, position - sliding_window + 1)
    return lo, min(position + 1, seq_len)


def gather_keys_ref(
    cache: torch.Tensor,
    scale: torch.Tensor | None,
    block_ids: torch.Tensor,
    lo: int,
    hi: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dequantized [hi - lo, Hkv, D] (float32, or `dtype`) for key positions [lo, hi), reading only the blocks
    covering them."""
    block_size = cache.shape[1]
    first, last = lo // block_size, (hi - 1) // block_size
    ids = block_ids[first : last + 1].long()
    values = cache[ids].to(dtype)  # [nb, BS, Hkv, D]
    if scale is not None:
        values = values * scale[ids][..., None].to(dtype)
    values = values.reshape(-1, *cache.shape[2:])
    start = lo - first * block_size
    return values[start : start + hi - lo]


def paged_attention_ref(a: PagedAttentionArgs) -> torch.Tensor:
    """-> f32[T, Hq, D]; softmax in float32. A float64 q runs all of it in float64 (-> f64): the tests' oracle,
    free of the float32 rounding the implementations are held to."""
    q, k_cache, v_cache, k_scale, v_scale = a.q, a.k_cache, a.v_cache, a.k_scale, a.v_scale
    block_tables, query_start_loc, seq_lens = a.block_tables, a.query_start_loc, a.seq_lens
    sm_scale, sliding_window = a.sm_scale, a.sliding_window
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    out = torch.zeros_like(q)
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for s, seq_len in enumerate(lens):
        q_start, q_end = starts[s], starts[s + 1]
        if q_end == q_start:
            continue
        first_pos = seq_len - (q_end - q_start)
        lo, _ = visible_key_range(first_pos, seq_len, sliding_window)
        k = gather_keys_ref(k_cache, k_scale, block_tables[s], lo, seq_len, dtype)  # [L, Hkv, D]
        v = gather_keys_ref(v_cache, v_scale, block_tables[s], lo, seq_len, dtype)
        k = k.repeat_interleave(Hq // Hkv, dim=1).transpose(0, 1)  # [Hq, L, D]
        v = v.repeat_interleave(Hq // Hkv, dim=1).transpose(0, 1)
        qs = q[q_start:q_end].transpose(0, 1)  # [Hq, q_len, D]
        scores = (qs @ k.transpose(1, 2)) * sm_scale  # [Hq, q_len, L]
        q_pos = torch.arange(first_pos, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(lo, seq_len, device=q.device)[None, :]
        visible = k_pos <= q_pos
        if sliding_window is not None:
            visible &= (q_pos - k_pos) < sliding_window
        scores = scores.masked_fill(~visible, -math.inf)
        probs = torch.softmax(scores.to(dtype), dim=-1)
        out[q_start:q_end] = (probs @ v).transpose(0, 1)
    return out


# Kernel design (both kernels):
#   * one program owns ONE KV head and all GROUP = Hq / Hkv query heads that read it, so each K/V tile is
#     loaded once for the whole group (MQA: Hkv = 1, every query head of a token in one program);
#   * a key tile is BLOCK_N consecutive key positions aligned to absolute positions; each position finds its
#     cache block through the block table (masked loads: table entries outside [lo, hi) are never read);
#   * int8 K/V stay int8 in memory; the per-token scales are applied in registers: scores = (q . k_int) * k_scale
#     and out = (p * v_scale) . v_int, which equals attention over the dequantized cache;
#   * online softmax in float32 with a finite initial max (-1e30), so a fully masked tile rescales by exactly 1
#     and adds exactly 0.
_NEG_INIT = tl.constexpr(-1.0e30)


@triton.jit
def _paged_decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_tables_ptr,
    qsl_ptr,
    seq_lens_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    sm_scale,
    window,
    block_size,
    num_splits,
    D,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_co,
    stride_ch,
    stride_sb,
    stride_so,
    stride_bt,
    GROUP: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    # Grid (sequence, kv head, split). Split i covers key positions [i * SPLIT_TOKENS, (i + 1) * SPLIT_TOKENS):
    # fixed absolute ranges, so a sequence's result does not depend on the rest of the batch. Writes the
    # unnormalized partial (m, l, acc) for each query head; empty splits write (-1e30, 0, 0).
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_row = tl.load(qsl_ptr + s)
    has_query = tl.load(qsl_ptr + s + 1) > q_row
    seq_len = tl.load(seq_lens_ptr + s)
    pos = seq_len - 1
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(pos - window + 1, 0)
    split_lo = split * SPLIT_TOKENS
    hi = tl.minimum(split_lo + SPLIT_TOKENS, seq_len)
    start = tl.maximum(split_lo, lo)
    hi = tl.where(has_query, hi, start)  # no query: no iterations

    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < GROUP
    mask_d = offs_d < D
    heads = kvh * GROUP + offs_h
    q_cols = tl.where(has_query, D, 0)  # without a query row, load nothing
    q = tl.load(
        q_ptr + q_row.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & (offs_d[None, :] < q_cols),
        other=0.0,
    )
    m = tl.full((BLOCK_H,), _NEG_INIT, dtype=tl.float32)
    l = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
    table = block_tables_ptr + s.to(tl.int64) * stride_bt
    for n0 in range(start - start % BLOCK_N, hi, BLOCK_N):
        keys = n0 + offs_n
        valid = (keys >= start) & (keys < hi)
        block = tl.load(table + keys // block_size, mask=valid, other=0).to(tl.int64)
        slot_off = block * stride_cb + (keys % block_size) * stride_co + kvh * stride_ch
        scale_off = block * stride_sb + (keys % block_size) * stride_so + kvh
        kv_mask = valid[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + slot_off[:, None] + offs_d[None, :], mask=kv_mask, other=0).to(tl.float32)
        if HAS_SCALE:
            k_s = tl.load(k_scale_ptr + scale_off, mask=valid, other=0.0)
        else:
            k_s = tl.full((BLOCK_N,), 1.0, tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (k_s * sm_scale)[None, :]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + slot_off[:, None] + offs_d[None, :], mask=kv_mask, other=0).to(tl.float32)
        if HAS_SCALE:
            v_s = tl.load(v_scale_ptr + scale_off, mask=valid, other=0.0)
        else:
            v_s = tl.full((BLOCK_N,), 1.0, tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p * v_s[None, :], v, input_precision=DOT_PRECISION)
        m = m_new

    part = (s.to(tl.int64) * GROUP * tl.num_programs(1) + heads) * num_splits + split  # [S, Hq, num_splits]
    tl.store(part_m_ptr + part, m, mask=mask_h)
    tl.store(part_l_ptr + part, l, mask=mask_h)
    tl.store(part_acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=mask_h[:, None] & mask_d[None, :])


@triton.jit
def _paged_decode_reduce_kernel(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    qsl_ptr,
    seq_lens_ptr,
    out_ptr,
    num_splits,
    D,
    stride_ot,
    stride_oh,
    SPLIT_TOKENS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Grid (sequence, query head): merge the sequence's split partials one by one in ascending split order,
    # with exactly the merge the prefill kernel applies in registers (see MERGE below), then normalize.
    s = tl.program_id(0)
    h = tl.program_id(1)
    q_row = tl.load(qsl_ptr + s)
    has_query = tl.load(qsl_ptr + s + 1) > q_row
    used = tl.cdiv(tl.load(seq_lens_ptr + s), SPLIT_TOKENS)
    base = (s.to(tl.int64) * tl.num_programs(1) + h) * num_splits
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    m_run = tl.load(part_m_ptr + base)
    l_run = tl.load(part_l_ptr + base)
    acc_run = tl.load(part_acc_ptr + base * D + offs_d, mask=mask_d, other=0.0)
    for i in range(1, used):
        m_i = tl.load(part_m_ptr + base + i)
        l_i = tl.load(part_l_ptr + base + i)
        acc_i = tl.load(part_acc_ptr + (base + i) * D + offs_d, mask=mask_d, other=0.0)
        # MERGE (identical in _paged_prefill_kernel)
        m_new = tl.maximum(m_run, m_i)
        a_run = tl.exp(m_run - m_new)
        a_i = tl.exp(m_i - m_new)
        l_run = l_run * a_run + l_i * a_i
        acc_run = acc_run * a_run + acc_i * a_i
        m_run = m_new
    out_cols = tl.where(has_query, D, 0)  # without a query row, store nothing
    # A row with no key (sequence length 0: a padded row of a fixed-size batch) has l = 0 and gets 0, not 0 / 0;
    # every other row has l > 0 and its division is unchanged.
    out = acc_run / tl.where(l_run > 0.0, l_run, 1.0)
    tl.store(out_ptr + q_row.to(tl.int64) * stride_ot + h * stride_oh + offs_d, out, mask=offs_d < out_cols)


@triton.jit
def _paged_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_tables_ptr,
    qsl_ptr,
    seq_lens_ptr,
    out_ptr,
    sm_scale,
    window,
    block_size,
    D,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_co,
    stride_ch,
    stride_sb,
    stride_so,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    # Grid (sequence, query tile, kv head). Rows of the program = BLOCK_Q query tokens x BLOCK_G heads of the
    # group (row r: token r // BLOCK_G, head r % BLOCK_G), so one K/V tile serves every query head.
    # Per row the arithmetic is the decode path's: the same absolute splits and key tiles, the same online
    # softmax inside a split, the same ascending merge of splits. Tiles or splits a row cannot see change
    # nothing (they rescale by exactly 1 and add exactly 0), so a token's output does not depend on its chunk,
    # its batch, or on whether it ran as decode or prefill (given row-independent tl.dot, as on GPUs).
    s = tl.program_id(0)
    q_tile = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(qsl_ptr + s)
    q_len = tl.load(qsl_ptr + s + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + s)
    first_pos = seq_len - q_len

    rows = tl.arange(0, BLOCK_Q * BLOCK_G)
    tok = q_tile * BLOCK_Q + rows // BLOCK_G
    g = rows % BLOCK_G
    mask_r = (tok < q_len) & (g < GROUP)
    heads = kvh * GROUP + g
    pos = first_pos + tok
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q_off = (q_start + tok).to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=mask_r[:, None] & mask_d[None, :], other=0.0)

    tile_first = first_pos + q_tile * BLOCK_Q
    hi = tl.minimum(tile_first + BLOCK_Q, seq_len)  # keys [lo, hi) cover every row of the tile
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(tile_first - window + 1, 0)
    hi = tl.where(q_tile * BLOCK_Q < q_len, hi, lo)  # tile past this sequence's queries: no iterations
    m_run = tl.full((BLOCK_Q * BLOCK_G,), _NEG_INIT, dtype=tl.float32)
    l_run = tl.zeros((BLOCK_Q * BLOCK_G,), dtype=tl.float32)
    acc_run = tl.zeros((BLOCK_Q * BLOCK_G, BLOCK_D), dtype=tl.float32)
    table = block_tables_ptr + s.to(tl.int64) * stride_bt
    offs_n = tl.arange(0, BLOCK_N)
    for split_lo in range(lo - lo % SPLIT_TOKENS, hi, SPLIT_TOKENS):
        start = tl.maximum(split_lo, lo)
        end = tl.minimum(split_lo + SPLIT_TOKENS, hi)
        m_i = tl.full((BLOCK_Q * BLOCK_G,), _NEG_INIT, dtype=tl.float32)
        l_i = tl.zeros((BLOCK_Q * BLOCK_G,), dtype=tl.float32)
        acc_i = tl.zeros((BLOCK_Q * BLOCK_G, BLOCK_D), dtype=tl.float32)
        for n0 in range(start - start % BLOCK_N, end, BLOCK_N):
            keys = n0 + offs_n
            valid = (keys >= start) & (keys < end)
            block = tl.load(table + keys // block_size, mask=valid, other=0).to(tl.int64)
            slot_off = block * stride_cb + (keys % block_size) * stride_co + kvh * stride_ch
            scale_off = block * stride_sb + (keys % block_size) * stride_so + kvh
            kv_mask = valid[:, None] & mask_d[None, :]
            k = tl.load(k_cache_ptr + slot_off[:, None] + offs_d[None, :], mask=kv_mask, other=0).to(tl.float32)
            if HAS_SCALE:
                k_s = tl.load(k_scale_ptr + scale_off, mask=valid, other=0.0)
            else:
                k_s = tl.full((BLOCK_N,), 1.0, tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (k_s * sm_scale)[None, :]
            visible = valid[None, :] & (keys[None, :] <= pos[:, None])
            if HAS_WINDOW:
                visible = visible & (pos[:, None] - keys[None, :] < window)
            scores = tl.where(visible, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_cache_ptr + slot_off[:, None] + offs_d[None, :], mask=kv_mask, other=0).to(tl.float32)
            if HAS_SCALE:
                v_s = tl.load(v_scale_ptr + scale_off, mask=valid, other=0.0)
            else:
                v_s = tl.full((BLOCK_N,), 1.0, tl.float32)
            acc_i = acc_i * alpha[:, None] + tl.dot(p * v_s[None, :], v, input_precision=DOT_PRECISION)
            m_i = m_new
        # MERGE (identical in _paged_decode_reduce_kernel)
        m_new = tl.maximum(m_run, m_i)
        a_run = tl.exp(m_run - m_new)
        a_i = tl.exp(m_i - m_new)
        l_run = l_run * a_run + l_i * a_i
        acc_run = acc_run * a_run[:, None] + acc_i * a_i[:, None]
        m_run = m_new

    out = acc_run / tl.where(l_run > 0.0, l_run, 1.0)[:, None]
    o_off = (q_start + tok).to(tl.int64)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_off, out, mask=mask_r[:, None] & mask_d[None, :])


def _check_paged_args(a: PagedAttentionArgs) -> None:
    q, k_cache, v_cache, k_scale, v_scale = a.q, a.k_cache, a.v_cache, a.k_scale, a.v_scale
    block_tables, query_start_loc, seq_lens, sliding_window = (
        a.block_tables,
        a.query_start_loc,
        a.seq_lens,
        a.sliding_window,
    )
    dev = q.device
    check_tensor("q", q, torch.float32, 3, dev)
    T, Hq, D = q.shape
    check(
        k_cache.dtype in (torch.int8, torch.bfloat16, torch.float32),
        f"k_cache: expected dtype int8, bfloat16 or float32, got {k_cache.dtype}",
    )
    check_tensor("k_cache", k_cache, k_cache.dtype, 4, dev)
    NB, BS, Hkv, Dc = k_cache.shape
    check(Dc == D, f"k_cache: head_dim {Dc} does not match q's {D}")
    check(Hkv > 0 and Hq % Hkv == 0, f"q: {Hq} query heads is not a multiple of k_cache's {Hkv} KV heads")
    check_tensor("v_cache", v_cache, k_cache.dtype, 4, dev)
    check(v_cache.shape == k_cache.shape, f"v_cache: expected shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    check(v_cache.stride() == k_cache.stride(), "v_cache: must have the same strides as k_cache")
    check(k_cache.stride(3) == 1, "k_cache: head_dim must be contiguous")
    if k_cache.dtype != torch.int8:
        check(k_scale is None and v_scale is None, "k_scale, v_scale: float caches have no scales (pass None)")
        return _check_tables(block_tables, query_start_loc, seq_lens, sliding_window, dev)
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        check(scale is not None, f"{name}: int8 caches need per-token scales")
        check_tensor(name, scale, torch.float32, 3, dev)
        check(scale.shape == (NB, BS, Hkv), f"{name}: expected shape {(NB, BS, Hkv)}, got {tuple(scale.shape)}")
        check(scale.stride(2) == 1, f"{name}: the KV-head dimension must be contiguous")
    check(v_scale.stride() == k_scale.stride(), "v_scale: must have the same strides as k_scale")
    _check_tables(block_tables, query_start_loc, seq_lens, sliding_window, dev)


def _check_tables(block_tables, query_start_loc, seq_lens, sliding_window, dev) -> None:
    check_tensor("block_tables", block_tables, torch.int32, 2, dev)
    S = block_tables.shape[0]
    check(block_tables.stride(1) == 1, "block_tables: rows must be contiguous")
    check_tensor("query_start_loc", query_start_loc, torch.int32, 1, dev)
    check(
        query_start_loc.shape[0] == S + 1, f"query_start_loc: expected {S + 1} elements, got {query_start_loc.shape[0]}"
    )
    check_tensor("seq_lens", seq_lens, torch.int32, 1, dev)
    check(seq_lens.shape[0] == S, f"seq_lens: expected {S} elements, got {seq_lens.shape[0]}")
    check(sliding_window is None or sliding_window >= 1, f"sliding_window: must be None or >= 1, got {sliding_window}")


def paged_attention_triton(a: PagedAttentionArgs, *, split_tokens: int | None = None) -> torch.Tensor:
    """Same semantics as paged_attention_ref. A batch where every sequence has exactly one query runs the
    split-KV decode kernel (+ reduction); anything else runs the prefill kernel. Deciding which, and the
    prefill grid, takes a.max_query_tokens (the engine's host-side figure); without it the launcher reads
    query_start_loc back (one synchronization).
    split_tokens: keys per split (a multiple of the key tile), aligned to absolute positions and used by both
    kernels; keep it fixed for a deployment, since a token's exact result depends on it."""
    _check_paged_args(a)
    q, k_cache, v_cache, k_scale, v_scale = a.q, a.k_cache, a.v_cache, a.k_scale, a.v_scale
    block_tables, query_start_loc, seq_lens = a.block_tables, a.query_start_loc, a.seq_lens
    sm_scale, sliding_window = a.sm_scale, a.sliding_window
    dev = q.device
    T, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    S = block_tables.shape[0]
    if T == 0 or S == 0:
        return torch.zeros_like(q)
    q = q if q.stride(2) == 1 else q.contiguous()
    group = Hq // Hkv
    interp = is_interpreted(dev)
    precision = "ieee" if interp else "tf32x3"
    block_d = next_pow2(D)
    window = sliding_window or 0
    common = (sm_scale, window, BS)
    has_scale = k_scale is not None
    if not has_scale:  # float caches: the kernels never read the scale pointers (HAS_SCALE=False)
        k_scale = v_scale = torch.empty((1, 1, 1), dtype=torch.float32, device=dev)
    strides = (
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_scale.stride(0),
        k_scale.stride(1),
        block_tables.stride(0),
    )
    block_n = 16 if interp else 32  # key tile: the same in both kernels (part of the per-row arithmetic)
    split = split_tokens or (16 if interp else 256)
    check(split % block_n == 0, f"split_tokens: must be a multiple of {block_n}, got {split}")
    max_q_len = a.max_query_tokens
    if max_q_len is None:
        max_q_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if T == S and max_q_len == 1:  # every sequence has exactly one query row: decode
        # the reduction stores every row (a padded row's zeros included), so the output needs no zero fill: on
        # the decode path the launcher runs no torch op besides the two kernels
        out = torch.empty_like(q)
        num_splits = triton.cdiv(block_tables.shape[1] * BS, split)
        part_m = torch.empty((S, Hq, num_splits), dtype=torch.float32, device=dev)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty((S, Hq, num_splits, D), dtype=torch.float32, device=dev)
        on_device(_paged_decode_split_kernel, dev)[(S, Hkv, num_splits)](
            q,
            k_cache,
            v_cache,
            k_scale,
            v_scale,
            block_tables,
            query_start_loc,
            seq_lens,
            part_m,
            part_l,
            part_acc,
            *common,
            num_splits,
            D,
            *strides,
            GROUP=group,
            SPLIT_TOKENS=split,
            HAS_WINDOW=sliding_window is not None,
            BLOCK_H=max(16, next_pow2(group)),
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            DOT_PRECISION=precision,
            HAS_SCALE=has_scale,
            **({} if interp else dict(num_warps=4, num_stages=2)),
        )
        on_device(_paged_decode_reduce_kernel, dev)[(S, Hq)](
            part_m,
            part_l,
            part_acc,
            query_start_loc,
            seq_lens,
            out,
            num_splits,
            D,
            out.stride(0),
            out.stride(1),
            SPLIT_TOKENS=split,
            BLOCK_D=block_d,
        )
        return out
    out = torch.zeros_like(q)
    block_g = next_pow2(group)
    # On a GPU a prefill program holds as many rows as a decode program (max(16, the group's heads)), with the
    # same warps: the two kernels' dots then take the same tensor-core instructions over the same tiles, so a
    # row's bits do not depend on the kernel it runs in (with 64-row tiles and 8 warps they did not match on an
    # H200: tests/kernels/test_kernels_gpu.py).
    block_q = max(1, 16 // block_g)
    on_device(_paged_prefill_kernel, dev)[(S, triton.cdiv(max_q_len, block_q), Hkv)](
        q,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        *common,
        D,
        *strides,
        out.stride(0),
        out.stride(1),
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_Q=block_q,
        HAS_WINDOW=sliding_window is not None,
        SPLIT_TOKENS=split,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_PRECISION=precision,
        HAS_SCALE=has_scale,
        **({} if interp else dict(num_warps=4, num_stages=2)),
    )
    return out
