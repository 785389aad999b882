"""The pieces around the Triton W8A8 GEMM kernel (salon/kernels/w8a8_triton.py) that its per-row
(salon/kernels/w8a8_gemm.py) and group-scaled (salon/kernels/w8a8_grouped.py) launchers share: their argument
checks (gemm_operands) and launch call (GemmOperands.launch), which tile a program computes, and the epilogue
after the dequantization (bias, GeGLU, residual, store). Both layouts evaluate them with the same operations, so
their epilogue bits agree."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from salon.kernels.triton_launch import check, check_tensor, on_device


@dataclass
class GemmOperands:
    """A launch's checked operands, unit-stride along K (the kernels' loads assume it), and its output."""

    a_q: torch.Tensor
    a_scale: torch.Tensor
    w_q: torch.Tensor
    w_scale: torch.Tensor
    bias: torch.Tensor | None
    residual: torch.Tensor | None
    out: torch.Tensor
    M: int
    K: int
    n_out: int

    def grid(self, cfg: dict) -> tuple[int]:
        return (triton.cdiv(self.M, cfg["BLOCK_M"]) * triton.cdiv(self.n_out, cfg["BLOCK_N"]),)

    def launch(
        self, kernel, cfg: dict, geglu: bool, group_scales: bool, two_terms: bool = False, **options
    ) -> torch.Tensor:
        """Run `kernel` (salon/kernels/w8a8_triton.py's) over the output with the scale layout group_scales
        selects (two_terms: a_q's rows [0, M) and [M, 2M) are the two terms of the M output rows, summed in the
        epilogue): its argument order is pointers, sizes, strides (w_scale's row stride after w_q's), then the
        layout and epilogue flags; its output."""
        if self.M == 0 or self.n_out == 0:
            return self.out
        strides = [
            self.a_q.stride(0),
            self.w_q.stride(0),
            self.w_scale.stride(0),
            self.residual.stride(0) if self.residual is not None else 0,
            self.out.stride(0),
        ]
        on_device(kernel, self.a_q.device)[self.grid(cfg)](
            self.a_q,
            self.a_scale,
            self.w_q,
            self.w_scale,
            self.bias if self.bias is not None else self.a_scale,
            self.residual if self.residual is not None else self.out,
            self.out,
            self.M,
            self.n_out,
            self.K,
            self.n_out,
            *strides,
            GROUP_SCALES=group_scales,
            HAS_BIAS=self.bias is not None,
            HAS_RESIDUAL=self.residual is not None,
            GEGLU=geglu,
            TWO_TERMS=two_terms,
            **options,
            **cfg,
        )
        return self.out


def gemm_operands(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    geglu: bool,
    check_w_scale,
    terms: int = 1,
) -> GemmOperands:
    """Check a W8A8 GEMM's arguments (ValueError naming what is wrong); check_w_scale(w_scale, M, K, N) checks
    the scales of the kernel's contract and returns them as the kernel reads them. terms = 2: a_q's 2M rows are
    two activation terms of M output rows (M in the result is the output rows')."""
    dev = a_q.device
    check_tensor("a_q", a_q, torch.int8, 2, dev)
    check_tensor("w_q", w_q, torch.int8, 2, dev)
    M, K = a_q.shape
    N = w_q.shape[0]
    check(w_q.shape[1] == K, f"w_q: expected {K} columns to match a_q, got {w_q.shape[1]}")
    check_tensor("a_scale", a_scale, torch.float32, 1, dev)
    check(a_scale.shape[0] == M, f"a_scale: expected {M} elements, got {a_scale.shape[0]}")
    check(M % terms == 0, f"a_q: {terms} activation terms need a multiple of {terms} rows, got {M}")
    M //= terms
    w_scale = check_w_scale(a_q, w_q, w_scale)
    check(not geglu or N % 2 == 0, f"w_q: geglu needs an even number of rows, got {N}")
    n_out = N // 2 if geglu else N
    if bias is not None:
        check_tensor("bias", bias, torch.float32, 1, dev)
        check(bias.shape[0] == N, f"bias: expected {N} elements, got {bias.shape[0]}")
        bias = bias.contiguous()
    if residual is not None:
        check_tensor("residual", residual, torch.float32, 2, dev)
        check(
            tuple(residual.shape) == (M, n_out), f"residual: expected shape {(M, n_out)}, got {tuple(residual.shape)}"
        )
        residual = residual if residual.stride(1) == 1 else residual.contiguous()
    return GemmOperands(
        a_q if a_q.stride(1) == 1 else a_q.contiguous(),
        a_scale.contiguous(),
        w_q if w_q.stride(1) == 1 else w_q.contiguous(),
        w_scale,
        bias,
        residual,
        torch.empty((M, n_out), dtype=torch.float32, device=dev),
        M,
        K,
        n_out,
    )


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
def tile_start(
    a_ptr,
    w_ptr,
    M,
    N_OUT,
    stride_am,
    stride_wn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """This program's output tile (grouped_tile's order) and its first K step: (offs_m, offs_n, mask_m, mask_n,
    a_ptrs [BLOCK_M, BLOCK_K] of a's rows, w_ptrs the [BLOCK_K, BLOCK_N] view of w^T); offs_k is tl.arange over
    BLOCK_K."""
    pid_m, pid_n = grouped_tile(M, N_OUT, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    return offs_m, offs_n, offs_m < M, offs_n < N_OUT, a_ptrs, w_ptrs


@triton.jit
def finish_tile(
    y,
    up,
    offs_m,
    offs_n,
    mask_m,
    mask_n,
    bias_ptr,
    res_ptr,
    out_ptr,
    UP_OFFSET,
    stride_rm,
    stride_om,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GEGLU: tl.constexpr,
):
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
