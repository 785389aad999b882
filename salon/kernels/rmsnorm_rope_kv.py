"""Gemma 3's q/k per-head RMSNorm and NeoX RoPE, and the KV write of the layer's new K and V, as one op.

    rmsnorm_rope_kv(q f32[T, Hq, D], k f32[T, Hkv, D] | None, v f32[T, Hkv, D] | None, q_norm f32[D],
                    k_norm f32[D] | None, eps, positions int64[T], base,
                    k_cache, v_cache, k_scale, v_scale, slot_mapping) -> f32[T, Hq, D]
        = rmsnorm_rope(q, q_norm, eps, positions, base), after
          kv_write(rmsnorm_rope(k, k_norm, eps, positions, base), v, k_cache, v_cache, k_scale, v_scale, slot_mapping)

A layer that reads another layer's KV passes k, v, k_norm, the caches and slot_mapping as None: q alone.
A negative slot writes nothing (a padded row, as salon.kernels.kv_write). The rotated K is not returned: the
attention reads it from the cache.

`compose(rmsnorm_rope, kv_write)` builds it from a family's two ops (the reference, the CPU family);
rmsnorm_rope_kv_triton is one launch with the bits of the Triton family's sequence (rmsnorm_triton, then
rope_neox_triton, for q and for k, then kv_write_triton): one program per (token, head) row, whose sum of squares
is rmsnorm_triton's (the same whole-row tl.sum with the same number of warps), and whose products, rotation and
quantization are the same float32 operations in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from salon.kernels.kv_write import kv_write_ref
from salon.kernels.quantize import SCALE_FLOOR
from salon.kernels.rmsnorm_rope import rmsnorm_rope_ref
from salon.kernels.rope import _inv_freq_on
from salon.kernels.triton_launch import check, check_tensor, next_pow2, on_device


def compose(rmsnorm_rope: Callable, kv_write: Callable, name: str = "rmsnorm_rope_kv") -> Callable:
    def rmsnorm_rope_kv(
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        q_norm: torch.Tensor,
        k_norm: torch.Tensor | None,
        eps: float,
        positions: torch.Tensor,
        base: float,
        k_cache: torch.Tensor | None = None,
        v_cache: torch.Tensor | None = None,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        slot_mapping: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """See the module docstring."""
        if k is not None:
            k_roped = rmsnorm_rope(k, k_norm, eps, positions, base)
            kv_write(k_roped, v, k_cache, v_cache, k_scale, v_scale, slot_mapping)
        return rmsnorm_rope(q, q_norm, eps, positions, base)

    rmsnorm_rope_kv.__name__ = rmsnorm_rope_kv.__qualname__ = name
    return rmsnorm_rope_kv


rmsnorm_rope_kv_ref = compose(rmsnorm_rope_ref, kv_write_ref, "rmsnorm_rope_kv_ref")


@triton.jit
def _quantize_store_halves(x1, x2, cache_ptr, scale_ptr, dst, offs_i, mask_i, HALF_D: tl.constexpr, scale_floor):
    # kv_write_triton's quantization of one row, over its two halves (the absmax is exact in any order)
    amax = tl.maximum(tl.max(tl.abs(x1), axis=0), tl.max(tl.abs(x2), axis=0))
    scale = tl.maximum(tl.math.div_rn(amax, 127.0), scale_floor)
    for half in tl.static_range(2):
        x = x1 if half == 0 else x2
        y = tl.math.div_rn(x, scale)
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        y = (y + 12582912.0) - 12582912.0  # round half to even, as salon.kernels.quantize
        tl.store(cache_ptr + dst + half * HALF_D + offs_i, y.to(tl.int8), mask=mask_i)
    tl.store(scale_ptr, scale)


@triton.jit
def _rmsnorm_rope_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    pos_ptr,
    inv_freq_ptr,
    slot_ptr,
    out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    Hq,
    Hkv,
    D,
    eps,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    scale_floor,
    HALF_D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # Program (t, h): q head h for h < Hq, else KV head h - Hq (its K normed, rotated and written, its V written).
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    is_q = h < Hq
    hk = h - Hq
    if is_q:
        row = q_ptr + t * stride_qt + h * stride_qh
        w_ptr = qw_ptr
    else:
        row = k_ptr + t * stride_kt + hk * stride_kh
        w_ptr = kw_ptr
    # rmsnorm_triton's row: the whole row's sum of squares in one tl.sum, r, then (x * r) * w
    cols = tl.arange(0, BLOCK_D)
    x = tl.load(row + cols, mask=cols < D, other=0.0)
    r = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / D + eps)
    # rope_neox_triton's rotation of the normed row's halves
    offs_i = tl.arange(0, BLOCK_HALF)
    mask_i = offs_i < HALF_D
    n1 = tl.load(row + offs_i, mask=mask_i, other=0.0) * r * tl.load(w_ptr + offs_i, mask=mask_i, other=0.0)
    n2 = tl.load(row + HALF_D + offs_i, mask=mask_i, other=0.0) * r
    n2 = n2 * tl.load(w_ptr + HALF_D + offs_i, mask=mask_i, other=0.0)
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + offs_i, mask=mask_i, other=0.0)
    cos = tl.cos(angle)
    sin = tl.sin(angle)
    o1 = n1 * cos - n2 * sin
    o2 = n2 * cos + n1 * sin
    if is_q:
        o_row = out_ptr + (t * Hq + h) * D
        tl.store(o_row + offs_i, o1, mask=mask_i)
        tl.store(o_row + HALF_D + offs_i, o2, mask=mask_i)
    else:
        slot = tl.load(slot_ptr + t)
        if slot >= 0:  # a padded row (slot -1) writes nothing
            # caches are contiguous: slot s's head h starts at element (s * Hkv + h) * D, its scale at s * Hkv + h
            dst = (slot * Hkv + hk) * D
            _quantize_store_halves(
                o1, o2, k_cache_ptr, k_scale_ptr + slot * Hkv + hk, dst, offs_i, mask_i, HALF_D, scale_floor
            )
            v_row = v_ptr + t * stride_vt + hk * stride_vh
            v1 = tl.load(v_row + offs_i, mask=mask_i, other=0.0)
            v2 = tl.load(v_row + HALF_D + offs_i, mask=mask_i, other=0.0)
            _quantize_store_halves(
                v1, v2, v_cache_ptr, v_scale_ptr + slot * Hkv + hk, dst, offs_i, mask_i, HALF_D, scale_floor
            )


def rmsnorm_rope_kv_triton(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    base: float,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> torch.Tensor:
    """One launch, the bits of the Triton family's unfused sequence (see the module docstring). Int8 caches
    with their scales only (the engine's float caches take the unfused ops)."""
    dev = q.device
    check_tensor("q", q, torch.float32, 3, dev)
    T, Hq, D = q.shape
    check(D % 2 == 0, f"q: head_dim must be even, got {D}")
    check_tensor("q_norm", q_norm, torch.float32, 1, dev)
    check(q_norm.shape[0] == D, f"q_norm: expected {D} elements, got {q_norm.shape[0]}")
    check_tensor("positions", positions, torch.int64, 1, dev)
    check(positions.shape[0] == T, f"positions: expected {T} elements, got {positions.shape[0]}")
    Hkv = 0
    if k is not None:
        check_tensor("k", k, torch.float32, 3, dev)
        Hkv = k.shape[1]
        check(tuple(k.shape) == (T, Hkv, D), f"k: expected shape {(T, Hkv, D)}, got {tuple(k.shape)}")
        check_tensor("v", v, torch.float32, 3, dev)
        check(tuple(v.shape) == (T, Hkv, D), f"v: expected shape {(T, Hkv, D)}, got {tuple(v.shape)}")
        check_tensor("k_norm", k_norm, torch.float32, 1, dev)
        check(k_norm.shape[0] == D, f"k_norm: expected {D} elements, got {k_norm.shape[0]}")
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            check_tensor(name, cache, torch.int8, 4, dev)
            check(
                tuple(cache.shape[2:]) == (Hkv, D), f"{name}: expected [NB, BS, {Hkv}, {D}], got {tuple(cache.shape)}"
            )
            check(cache.is_contiguous(), f"{name}: must be contiguous")
        check(v_cache.shape == k_cache.shape, f"v_cache: expected {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            check_tensor(name, scale, torch.float32, 3, dev)
            check(
                scale.shape == k_cache.shape[:3],
                f"{name}: expected {tuple(k_cache.shape[:3])}, got {tuple(scale.shape)}",
            )
            check(scale.is_contiguous(), f"{name}: must be contiguous")
        check_tensor("slot_mapping", slot_mapping, torch.int64, 1, dev)
        check(slot_mapping.shape[0] == T, f"slot_mapping: expected {T} elements, got {slot_mapping.shape[0]}")
    out = torch.empty((T, Hq, D), dtype=torch.float32, device=dev)
    if T == 0 or Hq + Hkv == 0:
        return out
    q = q if q.stride(2) == 1 else q.contiguous()
    if k is not None:
        k = k if k.stride(2) == 1 else k.contiguous()
        v = v if v.stride(2) == 1 else v.contiguous()
    kv = k is not None
    block_d = next_pow2(D)
    on_device(_rmsnorm_rope_kv_kernel, dev)[(T, Hq + Hkv)](
        q,
        k if kv else q,
        v if kv else q,
        q_norm.contiguous(),
        k_norm.contiguous() if kv else q_norm,
        positions.contiguous(),
        _inv_freq_on(D, float(base), dev),
        slot_mapping.contiguous() if kv else positions,
        out,
        k_cache if kv else out,
        v_cache if kv else out,
        k_scale if kv else out,
        v_scale if kv else out,
        Hq,
        Hkv,
        D,
        float(eps),
        q.stride(0),
        q.stride(1),
        k.stride(0) if kv else 0,
        k.stride(1) if kv else 0,
        v.stride(0) if kv else 0,
        v.stride(1) if kv else 0,
        SCALE_FLOOR,
        HALF_D=D // 2,
        BLOCK_D=block_d,
        BLOCK_HALF=next_pow2(D // 2),
        num_warps=min(16, max(1, block_d // 256)),  # rmsnorm_triton's, so its sum of squares has the same order
    )
    return out
