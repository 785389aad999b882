"""KV write: quantize new K/V per token per KV head and scatter them into their cache slots.

Cache layout (one layer):
    k_cache, v_cache  int8[num_blocks, block_size, num_kv_heads, head_dim]
    k_scale, v_scale  f32 [num_blocks, block_size, num_kv_heads]
    slot = block_id * block_size + offset_in_block   (slot_mapping[t] is token t's slot)
A negative slot writes nothing: the padded rows of a step run at a fixed batch size (the engine's decode
buckets, salon/engine/worker/cuda_graphs.py) carry slot -1, and no cache byte may change for them.
Each (token, head) row of head_dim values is quantized like an activation row (salon.kernels.quantize).
Float caches (bfloat16 or float32 k_cache/v_cache, no scales: k_scale = v_scale = None) store the
values as they are, rounded to the cache's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salon.kernels.quantize import SCALE_FLOOR, quantize_per_token_ref
from salon.kernels.triton_launch import check, check_tensor, next_pow2, on_device


def _write_one_ref(
    x: torch.Tensor, cache: torch.Tensor, scale: torch.Tensor | None, slot_mapping: torch.Tensor
) -> None:
    T, H, D = x.shape
    block_size = cache.shape[1]
    kept = slot_mapping >= 0  # a padded row (slot -1) writes nothing
    slots = slot_mapping[kept]
    blocks, offsets = slots // block_size, slots % block_size
    if scale is None:
        cache[blocks, offsets] = x[kept].to(cache.dtype)
        return
    q, s = quantize_per_token_ref(x.reshape(T * H, D))
    cache[blocks, offsets] = q.reshape(T, H, D)[kept]
    scale[blocks, offsets] = s.reshape(T, H)[kept]


def kv_write_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    slot_mapping: torch.Tensor,
) -> None:
    """In place: token t's K/V go to slot slot_mapping[t] of the caches; a row with a negative slot is skipped."""
    _write_one_ref(k, k_cache, k_scale, slot_mapping)
    _write_one_ref(v, v_cache, v_scale, slot_mapping)


@triton.jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    slot_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    H,
    D,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    scale_floor,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per token: quantize each head's row of K and V, write rows to the token's slot.
    # Caches are contiguous, so slot s's head h starts at element (s * H + h) * D; its scale at s * H + h.
    # A negative slot (a padded row) stores nothing: every store is masked off.
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < tl.where(slot >= 0, H, 0)
    mask = mask_h[:, None] & (offs_d[None, :] < D)
    dst = (slot * H + offs_h[:, None]) * D + offs_d[None, :]
    for which in tl.static_range(2):
        if which == 0:
            x = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask, other=0.0)
        else:
            x = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask, other=0.0)
        scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=1), 127.0), scale_floor)
        y = tl.math.div_rn(x, scale[:, None])
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        y = (y + 12582912.0) - 12582912.0  # round half to even, as salon.kernels.quantize
        if which == 0:
            tl.store(k_cache_ptr + dst, y.to(tl.int8), mask=mask)
            tl.store(k_scale_ptr + slot * H + offs_h, scale, mask=mask_h)
        else:
            tl.store(v_cache_ptr + dst, y.to(tl.int8), mask=mask)
            tl.store(v_scale_ptr + slot * H + offs_h, scale, mask=mask_h)


def kv_write_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    slot_mapping: torch.Tensor,
) -> None:
    """In place, same semantics as kv_write_ref. Caches and scales must be contiguous. Float caches (no
    scales) are a plain scatter on the device: kv_write_ref does it without a kernel."""
    if k_scale is None and v_scale is None and k_cache.dtype != torch.int8:
        kv_write_ref(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping)
        return
    dev = k.device
    check_tensor("k", k, torch.float32, 3, dev)
    T, H, D = k.shape
    check_tensor("v", v, torch.float32, 3, dev)
    check(tuple(v.shape) == (T, H, D), f"v: expected shape {(T, H, D)}, got {tuple(v.shape)}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, cache, torch.int8, 4, dev)
        check(tuple(cache.shape[2:]) == (H, D), f"{name}: expected [NB, BS, {H}, {D}], got {tuple(cache.shape)}")
        check(cache.is_contiguous(), f"{name}: must be contiguous")
    check(v_cache.shape == k_cache.shape, f"v_cache: expected shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        check_tensor(name, scale, torch.float32, 3, dev)
        check(
            scale.shape == k_cache.shape[:3],
            f"{name}: expected shape {tuple(k_cache.shape[:3])}, got {tuple(scale.shape)}",
        )
        check(scale.is_contiguous(), f"{name}: must be contiguous")
    check_tensor("slot_mapping", slot_mapping, torch.int64, 1, dev)
    check(slot_mapping.shape[0] == T, f"slot_mapping: expected {T} elements, got {slot_mapping.shape[0]}")
    if T == 0:
        return
    k = k if k.stride(2) == 1 else k.contiguous()
    v = v if v.stride(2) == 1 else v.contiguous()
    on_device(_kv_write_kernel, dev)[(T,)](
        k,
        v,
        slot_mapping.contiguous(),
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        H,
        D,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        SCALE_FLOOR,
        BLOCK_H=next_pow2(H),
        BLOCK_D=next_pow2(D),
    )
