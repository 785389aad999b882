"""An int8-weight Linear with fine activations as one op: the optional RMSNorm before it, the activations'
quantization, the GEMM, and the optional post-norm and residual after it. Two activation recipes:

two int8 terms (`linear_two_terms`, terms=2):
    h = rmsnorm(x, norm_weight)               if norm_weight is given
    q, s = quantize_two_terms(h)              rows [0, M) the first term, [M, 2M) the second
    y = w8a8_gemm(q, s, w_q, w_scale)         the weights read once for both terms
    o = y[:M] + y[M:]
    out = residual + rmsnorm(o, post_norm)    each part where it is given (eps is the one of both norms)

one int16 term (`linear_int16`, terms=1; salon.kernels.w16a8_grouped has the recipe):
    q, s = quantize_int16(h);  o = w16a8_grouped(q, s, w_q, w_scale);  out as above

one int8 term per token and 32 channels (`linear_group32`, terms=1; salon.kernels.w8a8_group32 has the recipe):
    q, s = quantize_group32(h);  o = w8a8_group32(q, s, w_q, w_scale);  out as above

`compose(rmsnorm, quantize, gemm, name, terms)` builds any of them from a family's own ops: the references
(`linear_two_terms_ref`, `linear_int16_ref`, `linear_group32_ref`), the Triton family's, and the CPU family's fallback.
salon/kernels/cpu/linear_two_terms.py does all of it in one C call with the same bits, for grouped weights
(w_scale f32[N, K/32]).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from salon.kernels.quantize import quantize_two_terms_ref
from salon.kernels.rmsnorm import rmsnorm_ref
from salon.kernels.w8a8_gemm import w8a8_gemm_ref
from salon.kernels.w8a8_group32 import quantize_group32_ref, w8a8_group32_ref
from salon.kernels.w16a8_grouped import quantize_int16_ref, w16a8_grouped_ref

LinearTwoTerms = Callable[..., torch.Tensor]


def compose(
    rmsnorm: Callable, quantize: Callable, gemm: Callable, name: str = "linear_two_terms", terms: int = 2
) -> LinearTwoTerms:
    """The op from a family's three ops, each its own call (`name`: the op's name, the family's suffix): `terms`
    2 (quantize gives both int8 terms of each row, the GEMM's rows [0, M) and [M, 2M) are summed) or 1 (the
    GEMM's rows are the output's: one int16 term a row, or group32's one int8 term)."""
    if terms not in (1, 2):
        raise ValueError(f"terms must be 1 or 2, got {terms}")

    def linear_two_terms(
        x: torch.Tensor,
        w_q: torch.Tensor,
        w_scale: torch.Tensor,
        norm_weight: torch.Tensor | None = None,
        eps: float = 0.0,
        post_norm: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x f32[M, K] -> f32[M, N] (see the module docstring)."""
        h = x if norm_weight is None else rmsnorm(x, norm_weight, eps)
        m = h.shape[0]
        y = gemm(*quantize(h), w_q, w_scale)
        out = y[:m] + y[m:] if terms == 2 else y
        if post_norm is not None:
            out = rmsnorm(out, post_norm, eps)
        return out if residual is None else residual + out

    linear_two_terms.__name__ = linear_two_terms.__qualname__ = name
    return linear_two_terms


def compose_summed(
    rmsnorm: Callable,
    norm_quantize: Callable,
    quantize: Callable,
    gemm_two_terms: Callable,
    rmsnorm_residual: Callable,
    name: str,
) -> LinearTwoTerms:
    """The two-term op with fewer launches, the Triton family's: the norm and both terms in one call
    (`norm_quantize(x, weight, eps)`, rmsnorm then quantize's bits), the terms summed in the GEMM's epilogue
    (`gemm_two_terms(q, s, w_q, w_scale, residual)`: salon.kernels.w8a8_two_terms, `y[:M] + y[M:]` and then
    `residual + out` with their bits), the residual added there too when there is no post-norm, else by the
    post-norm's launch (`rmsnorm_residual(out, post_norm, eps, residual)`: residual + rmsnorm's bits). The same bits
    as compose(rmsnorm, quantize, gemm) of the family's ops. The group32 op is built the same way from its
    one-term ops (salon.kernels.w8a8_group32_triton: a GEMM whose rows are the output's, the residual in its
    epilogue), with the bits of compose(..., terms=1)."""

    def linear_two_terms(
        x: torch.Tensor,
        w_q: torch.Tensor,
        w_scale: torch.Tensor,
        norm_weight: torch.Tensor | None = None,
        eps: float = 0.0,
        post_norm: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x f32[M, K] -> f32[M, N] (see the module docstring)."""
        q, s = quantize(x) if norm_weight is None else norm_quantize(x, norm_weight, eps)
        if post_norm is None:
            return gemm_two_terms(q, s, w_q, w_scale, residual)
        out = gemm_two_terms(q, s, w_q, w_scale)
        if residual is None:
            return rmsnorm(out, post_norm, eps)
        return rmsnorm_residual(out, post_norm, eps, residual)

    linear_two_terms.__name__ = linear_two_terms.__qualname__ = name
    return linear_two_terms


linear_two_terms_ref = compose(rmsnorm_ref, quantize_two_terms_ref, w8a8_gemm_ref, "linear_two_terms_ref")
linear_int16_ref = compose(rmsnorm_ref, quantize_int16_ref, w16a8_grouped_ref, "linear_int16_ref", terms=1)
linear_group32_ref = compose(rmsnorm_ref, quantize_group32_ref, w8a8_group32_ref, "linear_group32_ref", terms=1)
