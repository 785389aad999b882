"""The group32 recipe's GEMM (salon.kernels.w8a8_group32) on x86 CPUs: w8a8_group32_vnni in w8a8_grouped_vnni.c on
AVX-512 VNNI, w8a8_group32_avx2 in w8a8_grouped.c on AVX2 -- the grouped GEMMs' own loops
(salon.kernels.cpu.w8a8_grouped) with one activation scale per row and group of 32 channels, multiplied into the
weights' scale of the group before the group's exact int32 sum is scaled, the groups added in order from the first
one's product (no fused multiply-add): bit for bit w8a8_group32_ref, whatever M, the blocking or the thread split
(a row's result never depends on the batch it sits in). The VNNI kernel reads packed_weights' copy of the weights,
as the grouped GEMM does; weights with one scale per row (w_scale f32[N]) take it in every group, read as they lie.
"""

from __future__ import annotations

import torch

from salon.kernels.cpu.w8a8_grouped import GROUP32_ENTRIES, call_gemm, chosen_isa, library
from salon.kernels.w8a8_group32 import check_group32, w8a8_group32_ref


def w8a8_group32_cpu(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    isa: str | None = None,
    packed: bool = True,
) -> torch.Tensor | None:
    """f32[M, N], the bits of w8a8_group32_ref(a_q, a_scale, w_q, w_scale), for int8 a_q[M, K] (contiguous columns;
    rows may be strided), float32 a_scale[M, K/32], int8 w_q[N, K] (contiguous) and float32 w_scale[N, K/32] or [N],
    through the kernel for `isa` (by default the best this CPU runs); ValueError where check_group32 refuses the
    operands; None where the kernel does not take the call (not on this CPU or no C compiler, not on the CPU, other
    strides, M = 0, or for AVX2 an activation of -128), and the caller takes the reference. packed: the VNNI kernel
    reads packed_weights' copy of grouped weights (False: the weights as they lie; the same bits)."""
    groups = check_group32(a_q, a_scale, w_q, w_scale)
    m, k = a_q.shape
    n = w_q.shape[0]
    if (
        m == 0
        or n == 0
        or any(t.device.type != "cpu" for t in (a_q, a_scale, w_q, w_scale))
        or a_q.stride(1) != 1
        or not w_q.is_contiguous()
    ):
        return None
    isa = chosen_isa(isa)
    lib = library(isa)
    if lib is None:
        return None
    if w_scale.dim() == 1:  # one scale per row: the same scale in every group, the rows read as they lie
        w_scale, packed = w_scale[:, None].expand(n, groups), False
    w_scale = w_scale.contiguous()
    a_scale = a_scale.contiguous()
    return call_gemm(getattr(lib, GROUP32_ENTRIES[isa]), a_q, a_scale, w_q, w_scale, isa if packed else None)


def w8a8_group32_gemm_cpu(
    a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor
) -> torch.Tensor:
    """The group32 recipe's GEMM as the CPU family runs it: w8a8_group32_cpu, else the reference (same bits)."""
    out = w8a8_group32_cpu(a_q, a_scale, w_q, w_scale)
    return w8a8_group32_ref(a_q, a_scale, w_q, w_scale) if out is None else out
