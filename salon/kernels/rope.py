"""Rotary position embedding, NeoX layout (rotate the two halves of each head).

inv_freq[i] = 1 / base ** (2i / D)         i in [0, D/2), float32
angle[t, i] = float32(positions[t]) * inv_freq[i]
out[..., :D/2] = x1 * cos - x2 * sin,   out[..., D/2:] = x2 * cos + x1 * sin
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from salon.kernels.triton_launch import check, check_tensor, next_pow2, on_device


def rope_inv_freq(head_dim: int, base: float, device: torch.device | str = "cpu") -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (base**exponents)


@functools.lru_cache(maxsize=64)
def _inv_freq_on(head_dim: int, base: float, device: torch.device) -> torch.Tensor:
    """rope_inv_freq, computed once per (head_dim, base, device) for the kernel (read-only; never written)."""
    return rope_inv_freq(head_dim, base, device)


def rope_neox_ref(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """x f32[T, H, D], positions int64[T] -> f32[T, H, D]."""
    half = x.shape[-1] // 2
    angle = positions.float()[:, None] * rope_inv_freq(x.shape[-1], base, x.device)[None, :]
    cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@triton.jit
def _rope_neox_kernel(
    x_ptr,
    pos_ptr,
    inv_freq_ptr,
    out_ptr,
    H,
    stride_xt,
    stride_xh,
    stride_ot,
    stride_oh,
    HALF_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # One program per token: all heads of the token share its angles.
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_i = tl.arange(0, BLOCK_HALF)
    mask_i = offs_i < HALF_D
    mask = (offs_h[:, None] < H) & mask_i[None, :]
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + offs_i, mask=mask_i, other=0.0)
    cos = tl.cos(angle)[None, :]
    sin = tl.sin(angle)[None, :]
    x_row = x_ptr + t * stride_xt + offs_h[:, None] * stride_xh + offs_i[None, :]
    x1 = tl.load(x_row, mask=mask, other=0.0)
    x2 = tl.load(x_row + HALF_D, mask=mask, other=0.0)
    o_row = out_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_i[None, :]
    tl.store(o_row, x1 * cos - x2 * sin, mask=mask)
    tl.store(o_row + HALF_D, x2 * cos + x1 * sin, mask=mask)


def rope_neox_triton(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """x f32[T, H, D], positions int64[T] -> f32[T, H, D]. Same semantics as rope_neox_ref."""
    check_tensor("x", x, torch.float32, 3, x.device)
    check_tensor("positions", positions, torch.int64, 1, x.device)
    T, H, D = x.shape
    check(positions.shape[0] == T, f"positions: expected {T} elements, got {positions.shape[0]}")
    check(D % 2 == 0, f"x: head_dim must be even, got {D}")
    x = x if x.stride(2) == 1 else x.contiguous()
    out = torch.empty((T, H, D), dtype=torch.float32, device=x.device)
    if T == 0 or H == 0:
        return out
    inv_freq = _inv_freq_on(D, float(base), x.device)
    on_device(_rope_neox_kernel, x.device)[(T,)](
        x,
        positions.contiguous(),
        inv_freq,
        out,
        H,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        HALF_D=D // 2,
        BLOCK_H=next_pow2(H),
        BLOCK_HALF=next_pow2(D // 2),
    )
    return out
