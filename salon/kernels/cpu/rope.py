"""CPU fast path of NeoX RoPE: salon.kernels.rope's semantics with cos/sin read from tables, not recomputed.

The reference computes cos and sin of [T, D/2] angles in every layer of every step (36 times per Gemma
step, a third of a batch-1 decode step on this machine). Here each (head_dim, base) has tables of cos/sin
by position, computed with the reference's formula (float32 position x float32 inverse frequency) in
fixed chunks of CHUNK_POSITIONS aligned to absolute positions, one torch call per chunk: a position's
values depend neither on the batch it is in nor on how far the table had grown before (vectorized math
can round a tensor's tail differently, so the chunk shape is fixed), and every process computes the same.
The rotation itself runs in rope.c, one call for every head of every token (the tensor expression it
replaces, with the same bits, runs where the kernel cannot).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from salon.kernels.cpu import native
from salon.kernels.rope import rope_inv_freq

CHUNK_POSITIONS = 4096
_lock = threading.Lock()
_tables: dict[tuple[int, float], tuple[torch.Tensor, torch.Tensor]] = {}


def _chunk(head_dim: int, base: float, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(index * CHUNK_POSITIONS, (index + 1) * CHUNK_POSITIONS)
    angle = positions.float()[:, None] * rope_inv_freq(head_dim, base)[None, :]
    return torch.cos(angle), torch.sin(angle)


def rope_tables(head_dim: int, base: float, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin f32[n, head_dim / 2] for positions [0, n), n >= num_positions (a multiple of the chunk)."""
    key = (head_dim, float(base))
    tables = _tables.get(key)  # a step's layers all find theirs here, without the lock
    if tables is not None and tables[0].shape[0] >= num_positions:
        return tables
    with _lock:
        cos, sin = _tables.get(key, (torch.empty(0, head_dim // 2), torch.empty(0, head_dim // 2)))
        if cos.shape[0] < num_positions:
            have, need = cos.shape[0] // CHUNK_POSITIONS, -(-num_positions // CHUNK_POSITIONS)
            new = [_chunk(head_dim, base, i) for i in range(have, need)]
            cos = torch.cat([cos, *(c for c, _ in new)])
            sin = torch.cat([sin, *(s for _, s in new)])
            _tables[key] = (cos, sin)
        return cos, sin


_C_SOURCE = Path(__file__).with_name("rope.c")
_SIGNATURES = {"rope_rows": [ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 4 + [ctypes.c_int]}


def library() -> ctypes.CDLL | None:
    """rope.c (one C call per layer instead of the expression's ten tensor ops), where AVX2 + FMA run."""
    return native.load(_C_SOURCE, _SIGNATURES) if native.simd_isas() else None


def rope_neox_cpu(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """x f32[T, H, D], positions int64[T] -> f32[T, H, D] (contiguous): rope.c, or the same expression in
    PyTorch where it cannot run (the same bits either way)."""
    if positions.numel() == 0:
        return x.clone()
    lo, hi = (int(v) for v in torch.aminmax(positions))
    cos, sin = rope_tables(x.shape[-1], base, hi + 1)
    lib = library()
    if (
        lib is not None
        and lo >= 0
        and x.dim() == 3
        and x.dtype == torch.float32
        and x.stride(-1) == 1
        and x.shape[-1] % 2 == 0
        and positions.dtype == torch.int64
        and positions.is_contiguous()
        and positions.shape == (x.shape[0],)
        and x.device.type == "cpu"
    ):
        y = torch.empty(x.shape, dtype=torch.float32)
        lib.rope_rows(
            x.data_ptr(),
            x.shape[0],
            x.shape[1],
            x.shape[2],
            x.stride(0),
            x.stride(1),
            positions.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            y.data_ptr(),
            torch.get_num_threads(),
        )
        return y
    return _rope_from_tables(x, positions, cos, sin)


def _rope_from_tables(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    cos, sin = cos[positions][:, None, :], sin[positions][:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
