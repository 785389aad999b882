"""W8A8 GEMM: int8 activations (per-token scales) x int8 weights (per-output-channel scales).

    acc[m, n] = sum_k a_q[m, k] * w_q[n, k]                    exact, int32
    y[m, n]   = float(acc[m, n]) * a_scale[m] * w_scale[n]     (evaluated left to right)
    y        += bias[n]                                        (optional)
    geglu:      out[m, j] = gelu_tanh(y[m, j]) * y[m, N/2 + j]  rows [0, N/2) of w are the gate, [N/2, N) the up
    out      += residual[m, :]                                 (optional, added last)

The integer accumulation makes the result independent of tiling and batch size (batch invariance).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from salon.kernels.triton_gemm_tile import gemm_operands
from salon.kernels.triton_launch import check, check_tensor, is_interpreted
from salon.kernels.w8a8_grouped import w8a8_grouped_scaled_ref, w8a8_grouped_triton
from salon.kernels.w8a8_triton import w8a8_kernel

# A float32 dot of int8-valued vectors is exact while |partial sum| < 2**24: K * 127 * 127 < 2**24 for K <= 1040.
EXACT_F32_CHUNK_K = 1024


def int8_matmul_exact(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """a_q int8[M, K] @ w_q int8[N, K]^T -> int32[M, N], exact (float32 GEMMs over K chunks, summed in int32)."""
    M, K = a_q.shape
    acc = torch.zeros((M, w_q.shape[0]), dtype=torch.int32, device=a_q.device)
    for k0 in range(0, K, EXACT_F32_CHUNK_K):
        a = a_q[:, k0 : k0 + EXACT_F32_CHUNK_K].float()
        w = w_q[:, k0 : k0 + EXACT_F32_CHUNK_K].float()
        acc += (a @ w.T).to(torch.int32)
    return acc


def w8a8_gemm_ref(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    geglu: bool = False,
) -> torch.Tensor:
    """-> f32[M, N], or f32[M, N/2] with geglu. A w_scale of f32[N, K/32] selects the group-scaled contract
    (salon.kernels.w8a8_grouped)."""
    if w_scale.dim() == 2:
        y = w8a8_grouped_scaled_ref(a_q, a_scale, w_q, w_scale)
        return w8a8_epilogue_after_scales(y, bias, residual, geglu)
    return w8a8_epilogue(int8_matmul_exact(a_q, w_q).float(), a_scale, w_scale, bias, residual, geglu)


def w8a8_epilogue(
    y: torch.Tensor,
    a_scale: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    geglu: bool,
) -> torch.Tensor:
    """The dequantization and epilogue every PyTorch path shares, in this order (y: float32(acc), overwritten):
    y * a_scale[m] * w_scale[n]; + bias; geglu (gate rows first); + residual."""
    y.mul_(a_scale[:, None]).mul_(w_scale[None, :])
    return w8a8_epilogue_after_scales(y, bias, residual, geglu)


def w8a8_epilogue_after_scales(
    y: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, geglu: bool
) -> torch.Tensor:
    """The rest of w8a8_epilogue, for a y that already holds float(acc) * a_scale[m] * w_scale[n]."""
    if bias is not None:
        y.add_(bias)
    if geglu:
        half = y.shape[1] // 2
        y = F.gelu(y[:, :half], approximate="tanh") * y[:, half:]
    if residual is not None:
        y = y + residual
    return y


def _gemm_config(M: int, N: int, device: torch.device) -> dict:
    """Tile sizes. The int32 sums are exact whatever the tiling, and the epilogue is per element, so the
    result does not depend on the configuration (batch invariance holds across M buckets)."""
    if is_interpreted(device):
        # The interpreter runs one numpy pass per program: wide N tiles keep a 262,144-row output projection
        # at a few hundred programs instead of thousands.
        return dict(BLOCK_M=16, BLOCK_N=32 if N <= 1024 else 16384, BLOCK_K=32, GROUP_M=4)
    if M <= 16:  # decode: weight-bandwidth bound, many N tiles to fill the SMs
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=4)
    if M <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)


def w8a8_gemm_triton(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    geglu: bool = False,
) -> torch.Tensor:
    """-> f32[M, N], or f32[M, N/2] with geglu. Same semantics as w8a8_gemm_ref (a 2-D w_scale: the grouped
    kernel of salon.kernels.w8a8_grouped)."""
    if w_scale.dim() == 2:
        return w8a8_grouped_triton(a_q, a_scale, w_q, w_scale, bias=bias, residual=residual, geglu=geglu)
    g = gemm_operands(a_q, a_scale, w_q, w_scale, bias, residual, geglu, _per_row_scales)
    return g.launch(w8a8_kernel, _gemm_config(g.M, g.n_out, a_q.device), geglu, group_scales=False)


def _per_row_scales(a_q: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    check_tensor("w_scale", w_scale, torch.float32, 1, a_q.device)
    check(w_scale.shape[0] == w_q.shape[0], f"w_scale: expected {w_q.shape[0]} elements, got {w_scale.shape[0]}")
    return w_scale.contiguous()
