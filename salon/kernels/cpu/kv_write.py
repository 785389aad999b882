"""CPU fast path of the KV write: quantize each (token, KV head) row and store it in its cache slot, in one
pass of quantize.c's kv_write_rows (its AVX-512 build where the CPU has AVX-512, else its AVX2 + FMA one).
Same bits as salon.kernels.kv_write.kv_write_ref, which runs where neither build can."""

from __future__ import annotations

import torch

from salon.kernels.cpu.quantize import kernel
from salon.kernels.kv_write import kv_write_ref
from salon.kernels.quantize import SCALE_FLOOR


def kv_write_cpu(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    isa: str | None = None,
) -> None:
    """In place: token t's K/V go to slot slot_mapping[t] of the caches (float caches: kv_write_ref). `isa`
    picks a build of the kernel (tests)."""
    fn = kernel("kv_write_rows", isa)
    caches = (k_cache, v_cache, k_scale, v_scale)
    if (
        fn is None
        or k_scale is None
        or v_scale is None
        or k.dtype != torch.float32
        or v.dtype != torch.float32
        or any(not c.is_contiguous() or c.device.type != "cpu" for c in caches)
        or k_cache.dtype != torch.int8
        or v_cache.dtype != torch.int8
    ):
        kv_write_ref(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping)
        return
    t, h, d = k.shape
    if t == 0:
        return
    slots = slot_mapping.to(torch.int64).contiguous()
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        x = x.contiguous()
        fn(
            x.data_ptr(),
            t,
            h,
            d,
            cache.data_ptr(),
            scale.data_ptr(),
            slots.data_ptr(),
            SCALE_FLOOR,
            torch.get_num_threads(),
        )
