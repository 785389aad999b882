"""The PyTorch path of CPU paged attention (salon/kernels/cpu/paged_attention.py uses it where the C kernel
cannot run), batch- and chunk-invariant by construction: each query row's result depends on
that row alone.

  - keys are visited in tiles of TILE_TOKENS positions aligned to absolute positions
    (tile j = positions [j*TILE, (j+1)*TILE)), from the tile holding the query's first visible key
    upwards; iteration k handles tile first_tile(query) + k of every query at once;
  - scores of one (query, KV head, tile) are one element of a torch.bmm ([G, D] @ [D, TILE]) and the
    weighted values one element of another ([G, TILE] @ [TILE, D]); bmm results per batch element
    depend neither on the batch size nor on whether an operand is a stride-0 expansion;
  - an online softmax combines the tiles in ascending order. Keys a query may not see (before the
    window, after itself, past its tile range) are masked to -inf, so a tile with nothing visible
    contributes exactly 0 and rescales by exactly exp(0) = 1: extra iterations are no-ops;
  - the query count is padded to a multiple of ROW_PAD so that every elementwise tensor has a size
    that vectorized loops cover without a scalar tail (torch's scalar exp may differ from the
    vector one by an ulp, which would make a row's result depend on its index).

Each distinct (sequence, tile) is dequantized once. Runs of consecutive queries reading the same
tile (prefill chunks) multiply against it in one matmul of run x G rows when this machine's BLAS gives
such a matmul the same bits per row as the per-query bmm (checked once per shape at first use, see
_matmul_rows_match_bmm; otherwise through a stride-0 bmm); scattered queries (decodes) gather their
tiles and share one bmm. All give the same bits per query.

Block-table entries of blocks that no query of the sequence can see are never dereferenced: they
are replaced by block 0 before the gather. Every cache entry holds finite values (int8 times a
finite scale), and invisible keys get probability exactly 0, so what is read there never matters.
"""

from __future__ import annotations

import math

import torch

from salon.kernels.paged_attention import PagedAttentionArgs

TILE_TOKENS = 64
ROW_PAD = 32
# A run of at least this many queries on one tile uses the stride-0 path instead of the gather.
MIN_RUN_ROWS = 8


_ROWS_MATCH: dict[tuple[int, int, int], bool] = {}


def _matmul_rows_match_bmm(g: int, k: int, n: int) -> bool:
    """Whether [r*g, k] @ [k, n] gives, row for row, the bits of r separate [g, k] @ [k, n] bmm products.

    A BLAS picks its kernel by shape, and small row counts can take a path that sums in another order
    (seen here: 1, 2, 3, 5-7, 9-11 rows). The fast path is used only where a probe over several run
    lengths agrees bit for bit; the answer is cached per (g, k, n).
    """
    key = (g, k, n)
    if key not in _ROWS_MATCH:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(257 * g, k, generator=gen)
        b = torch.randn(k, n, generator=gen)
        per_query = torch.bmm(a.view(257, g, k), b.expand(257, k, n)).reshape(257 * g, n)
        _ROWS_MATCH[key] = all(
            torch.equal(a[: r * g] @ b, per_query[: r * g]) for r in (MIN_RUN_ROWS, 9, 31, 32, 100, 257)
        )
    return _ROWS_MATCH[key]


def _tile_products(
    x: torch.Tensor,
    tiles: torch.Tensor,
    u_k: torch.Tensor,
    long_runs: list[tuple[int, int, int]],
    scattered: torch.Tensor | None,
    use_matmul: bool,
) -> torch.Tensor:
    """Per query row t and KV head h: x[h, t] [G, K] @ tiles[h, u_k[t]] [K, N] -> [Hkv, T_pad, G, N].

    Runs of rows on one tile multiply against it directly (one matmul of run x G rows, or a stride-0
    bmm); the other rows gather their tiles into one bmm. Every path gives the same bits per row.
    """
    hkv, t_pad, g, k = x.shape
    n = tiles.shape[-1]
    if not long_runs:
        return torch.bmm(x.reshape(hkv * t_pad, g, k), tiles[:, u_k].reshape(hkv * t_pad, k, n)).view(hkv, t_pad, g, n)
    out = torch.empty((hkv, t_pad, g, n))
    for a, b, u in long_runs:
        for h in range(hkv):
            if use_matmul:
                out[h, a:b] = (x[h, a:b].reshape(-1, k) @ tiles[h, u]).view(b - a, g, n)
            else:
                out[h, a:b] = torch.bmm(x[h, a:b], tiles[h, u].expand(b - a, k, n))
    if scattered is not None:
        m = scattered.numel()
        xs = x[:, scattered].reshape(hkv * m, g, k)
        ts = tiles[:, u_k[scattered]].reshape(hkv * m, k, n)
        out[:, scattered] = torch.bmm(xs, ts).view(hkv, m, g, n)
    return out


def _pad_rows(x: torch.Tensor, num_rows: int) -> torch.Tensor:
    extra = num_rows - x.shape[0]
    return x if extra == 0 else torch.cat([x, x[:1].expand(extra, *x.shape[1:])])


def _runs(u: torch.Tensor) -> list[tuple[int, int, int]]:
    """Maximal runs [start, end) of equal values in u, as (start, end, value)."""
    change = torch.nonzero(u[1:] != u[:-1]).flatten() + 1
    bounds = [0, *change.tolist(), u.numel()]
    values = u[bounds[:-1]].tolist()
    return [(bounds[i], bounds[i + 1], values[i]) for i in range(len(values))]


def paged_attention_torch(a: PagedAttentionArgs) -> torch.Tensor:
    """-> f32[T, Hq, D]."""
    q, k_cache, v_cache, k_scale, v_scale = a.q, a.k_cache, a.v_cache, a.k_scale, a.v_scale
    block_tables, query_start_loc, seq_lens = a.block_tables, a.query_start_loc, a.seq_lens
    sm_scale, sliding_window = a.sm_scale, a.sliding_window
    T, Hq, D = q.shape
    _, BS, Hkv, _ = k_cache.shape
    if T == 0:
        return torch.empty_like(q)
    G = Hq // Hkv
    tile = max(BS, TILE_TOKENS // BS * BS)
    bpt = tile // BS  # blocks per tile

    # Per sequence: first query position and first visible key position.
    starts = query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    seq_first_pos = seq_lens.long() - q_lens
    if sliding_window is None:
        seq_lo = torch.zeros_like(seq_first_pos)
    else:
        seq_lo = (seq_first_pos - sliding_window + 1).clamp(min=0)

    # Per query row (padded with copies of row 0, whose results are dropped).
    T_pad = -(-T // ROW_PAD) * ROW_PAD
    seq_of_row = _pad_rows(torch.repeat_interleave(torch.arange(q_lens.numel()), q_lens), T_pad)
    rows = _pad_rows(torch.arange(T), T_pad)
    positions = seq_first_pos[seq_of_row] + (rows - starts[seq_of_row])
    if sliding_window is None:
        lo = torch.zeros_like(positions)
    else:
        lo = (positions - sliding_window + 1).clamp(min=0)
    first_tile = lo // tile
    # A row before any key (position -1: a padded row, sequence length 0) visits tile 0 with nothing visible and
    # is zeroed at the end; its table entries are never dereferenced (block_seen below).
    num_tiles = (positions // tile - first_tile + 1).clamp(min=1)
    max_tiles = int(num_tiles.max())

    # Distinct (sequence, tile) pairs, dequantized once: Ku [Hkv, U, D, tile], Vu [Hkv, U, tile, D].
    ks = torch.arange(max_tiles)
    tile_of = first_tile[:, None] + ks[None, :]  # [T_pad, K]
    clamped = torch.minimum(tile_of, (first_tile + num_tiles - 1)[:, None])  # past the range: masked anyway
    stride = int(clamped.max()) + 1
    uniq, inverse = torch.unique(seq_of_row[:, None] * stride + clamped, return_inverse=True)
    u_seq, u_tile = uniq // stride, uniq % stride
    block_idx = u_tile[:, None] * bpt + torch.arange(bpt)  # [U, bpt]
    first_key, last_key = block_idx * BS, block_idx * BS + BS - 1
    block_seen = (last_key >= seq_lo[u_seq, None]) & (first_key < seq_lens.long()[u_seq, None])
    tables = block_tables.long()[u_seq]
    ids = torch.where(block_seen, tables.gather(1, block_idx.clamp(max=tables.shape[1] - 1)), 0)
    U = uniq.numel()
    # int8 values as floats; the per-token scales are applied to the (much smaller) scores and
    # probabilities instead: q.(s k) = (q.k) s and sum p (s v) = sum (p s) v.
    Ku = k_cache[ids].float().view(U, tile, Hkv, D).permute(2, 0, 3, 1).contiguous()
    Vu = v_cache[ids].float().view(U, tile, Hkv, D).permute(2, 0, 1, 3).contiguous()
    if k_scale is None:  # float caches: unit scales
        Ks = torch.full((Hkv, U, tile), sm_scale)
        Vs = torch.ones((Hkv, U, tile))
    else:
        Ks = (k_scale[ids].view(U, tile, Hkv).permute(2, 0, 1) * sm_scale).contiguous()  # [Hkv, U, tile]
        Vs = v_scale[ids].view(U, tile, Hkv).permute(2, 0, 1).contiguous()

    qh = _pad_rows(q, T_pad).view(T_pad, Hkv, G, D).transpose(0, 1).contiguous()  # [Hkv, T_pad, G, D]
    m = torch.full((Hkv, T_pad, G), -math.inf)
    l = torch.zeros((Hkv, T_pad, G))
    acc = torch.zeros((Hkv, T_pad, G, D))
    offsets = torch.arange(tile)
    qk_matmul, pv_matmul = _matmul_rows_match_bmm(G, D, tile), _matmul_rows_match_bmm(G, tile, D)
    for k in range(max_tiles):
        u_k = inverse[:, k]
        key_pos = tile_of[:, k, None] * tile + offsets  # [T_pad, tile]
        visible = (key_pos >= lo[:, None]) & (key_pos <= positions[:, None])

        runs = _runs(u_k)
        long_runs = [r for r in runs if r[1] - r[0] >= MIN_RUN_ROWS]
        scattered = None
        if len(long_runs) != len(runs):
            mask = torch.ones(T_pad, dtype=torch.bool)
            for a, b, _ in long_runs:
                mask[a:b] = False
            scattered = torch.nonzero(mask).flatten()

        scores = _tile_products(qh, Ku, u_k, long_runs, scattered, qk_matmul) * Ks[:, u_k, None, :]
        scores.masked_fill_(~visible[None, :, None, :], -math.inf)

        m_new = torch.maximum(m, scores.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(scores - m_new[..., None])
        l = l * alpha + p.sum(-1)

        pv = _tile_products(p * Vs[:, u_k, None, :], Vu, u_k, long_runs, scattered, pv_matmul)
        acc = acc * alpha[..., None] + pv
        m = m_new
    out = (acc / l[..., None]).transpose(0, 1).reshape(T_pad, Hq, D)
    out[positions < 0] = 0.0
    return out[:T].contiguous()
