"""The pieces of a W8A8 GEMM tile that the per-row (kernels/w8a8_gemm.py) and group-scaled
(kernels/w8a8_grouped.py) Triton kernels share: which tile a program computes, and the epilogue after the
dequantization (bias, GeGLU, residual, store). Both kernels evaluate them with the same operations, so their
epilogue bits agree."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(M, N_OUT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of this program in grouped order: consecutive programs share w tiles in L2."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N_OUT, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % group_size
    pid_n = (pid % (GROUP_M * num_n)) // group_size
    return pid_m, pid_n


@triton.jit
def finish_tile(y, up, offs_m, offs_n, mask_m, mask_n, bias_ptr, res_ptr, out_ptr, UP_OFFSET, stride_rm, stride_om,
                HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GEGLU: tl.constexpr):
    """y (and, with GEGLU, up): the dequantized tile. + bias; geglu: gelu_tanh(y) * up; + residual; store."""
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if GEGLU:
        if HAS_BIAS:
            up += tl.load(bias_ptr + UP_OFFSET + offs_n, mask=mask_n, other=0.0)[None, :]
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        inner = tl.minimum(tl.maximum(inner, -15.0), 15.0)  # tanh(+-15) is +-1 in float32; keeps exp finite
        tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
        y = 0.5 * y * (1.0 + tanh) * up
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_RESIDUAL:
        y += tl.load(res_ptr + offs_m[:, None].to(tl.int64) * stride_rm + offs_n[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :], y, mask=mask)
