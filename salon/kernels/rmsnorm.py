"""RMSNorm, y = x / sqrt(mean(x^2) + eps) * weight over the last dimension, with its float32 sum in one fixed
order, so a C kernel can give the same bits on any CPU (torch's own reductions pick their order by the CPU's
vector width and the tensor's shape).

The contract (rmsnorm_ref, and salon/kernels/cpu/rmsnorm.c), per row of K values, every operation rounded to float32:

    acc[j] = sum of x[16i + j]^2 over i = 0, 1, ... in that order (16 lane sums; the square rounded, then the sum)
    s = ((lanes 0-7 + 8-15), then 0-3 + 4-7, then 0-1 + 2-3, then 0 + 1)     (a fixed tree)
    r = 1 / sqrt(s * float32(1 / K) + float32(eps))           (IEEE sqrt and division, correctly rounded)
    y = (x * r) * weight

rmsnorm_triton is the Triton family's: one program per row, tl.sum's order (close to the contract, not bit
for bit, like the Triton RMSNorm behind the quantizer in salon/kernels/quantize.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from salon.kernels.triton_launch import check, check_tensor, next_pow2, on_device

LANES = 16


def sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """f32[..., 1]: the contract's sum of x^2 over the last dimension (16 lane sums in order, a fixed tree)."""
    k = x.shape[-1]
    sq = x * x
    pad = -k % LANES
    if pad:
        sq = torch.cat([sq, sq.new_zeros(*sq.shape[:-1], pad)], dim=-1)
    lanes = sq.reshape(*sq.shape[:-1], -1, LANES)
    acc = lanes[..., 0, :]
    for i in range(1, lanes.shape[-2]):
        acc = acc + lanes[..., i, :]
    while acc.shape[-1] > 1:
        half = acc.shape[-1] // 2
        acc = acc[..., :half] + acc[..., half:]
    return acc


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x f32[..., K], weight f32[K] (Gemma's +1 already in it) -> f32[..., K], the contract's bits."""
    k = x.shape[-1]
    acc = sum_of_squares(x)
    inv_k = torch.tensor(1.0 / k, dtype=torch.float32, device=x.device)
    eps_t = torch.tensor(eps, dtype=torch.float32, device=x.device)
    v = acc * inv_k + eps_t
    # IEEE sqrt, correctly rounded to float32: torch.sqrt is not (its vector math can be an ulp off); math.sqrt
    # in float64, then rounded to float32, is (float64 has more than twice float32's precision plus two bits)
    root = torch.tensor([math.sqrt(t) for t in v.flatten().tolist()], dtype=torch.float32, device=x.device)
    r = torch.ones((), dtype=torch.float32, device=x.device) / root.view(v.shape)
    return x * r * weight


_MAX_ROW = 32768


@triton.jit
def _rmsnorm_rows_kernel(x_ptr, w_ptr, y_ptr, res_ptr, K, eps, BLOCK_K: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one program per row; the whole row in registers (BLOCK_K >= K)
    cols = tl.arange(0, BLOCK_K)
    mask = cols < K
    x = tl.load(x_ptr + row * K + cols, mask=mask, other=0.0)
    r = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / K + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = x * r * w
    if HAS_RESIDUAL:  # residual + the normed row (rmsnorm_residual_triton), rounded once as the separate add is
        y = tl.load(res_ptr + row * K + cols, mask=mask, other=0.0) + y
    tl.store(y_ptr + row * K + cols, y, mask=mask)


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x f32[..., K], weight f32[K] -> f32[..., K] (contiguous)."""
    return _launch_rmsnorm(x, weight, eps, None)


def rmsnorm_residual_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor) -> torch.Tensor:
    """residual + rmsnorm_ref(x, weight, eps): a post-norm and the residual add after it."""
    return residual + rmsnorm_ref(x, weight, eps)


def rmsnorm_residual_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor) -> torch.Tensor:
    """residual + rmsnorm_triton(x, weight, eps) in one launch, with the bits of the two (the normed row
    stays in registers, float32 as stored; the add is the same one rounding)."""
    check(
        residual.shape == x.shape and residual.dtype == torch.float32 and residual.device == x.device,
        f"residual: expected float32 {tuple(x.shape)} on {x.device}, got {residual.dtype} {tuple(residual.shape)}",
    )
    return _launch_rmsnorm(x, weight, eps, residual)


def _launch_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None) -> torch.Tensor:
    check(
        x.dim() >= 1 and x.dtype == torch.float32,
        f"x: expected float32 with a last dimension, got {x.dtype} of {x.dim()} dimensions",
    )
    k = x.shape[-1]
    check(0 < k <= _MAX_ROW, f"x: row length must be in [1, {_MAX_ROW}], got {k}")
    check_tensor("weight", weight, torch.float32, 1, x.device)
    check(weight.shape[0] == k, f"weight: expected {k} elements, got {weight.shape[0]}")
    rows = x.reshape(-1, k).contiguous()
    y = torch.empty_like(rows)
    if rows.shape[0]:
        block_k = next_pow2(k)
        on_device(_rmsnorm_rows_kernel, x.device)[(rows.shape[0],)](
            rows,
            weight.contiguous(),
            y,
            rows if residual is None else residual.reshape(-1, k).contiguous(),
            k,
            float(eps),
            BLOCK_K=block_k,
            HAS_RESIDUAL=residual is not None,
            num_warps=min(16, max(1, block_k // 256)),
        )
    return y.view(x.shape)
