"""The group32 recipe's output projection: one int8 term per token and 32 channels for every vocabulary row (half
the int8 products of two terms: what a decode step of several sequences is bound by on the CPU), and the two-term
values for the rows that could be the largest under two terms, so that greedy decoding picks what it picks with two
terms on the output projection. The contract, for x f32[M, K] (no norm, post-norm or residual: the output
projection takes none) and grouped weights w_q int8[N, K], w_scale f32[N, K/32] (G = K/32 groups):

    a      = linear_group32(x, w_q, w_scale)                  every row's group32 value
    e      = linear_two_terms(x, w_q, w_scale)                the two-term value (needed where rescored only)
    s      = the group32 term's scales of x, each row's sorted largest first; s2 = its second two-term scale
    cap    = s[:, OUTLIER_GROUPS] (0 where G <= OUTLIER_GROUPS)
    alpha  = (cap + s2) * RESCORE_MARGIN                      f32[M]
    beta   = ((s[:, 0] - cap) + (s[:, 1] - cap) + ...) * RESCORE_MARGIN    the OUTLIER_GROUPS largest, in that order
    t      = alpha[:, None] * l1[None, :] + beta[:, None] * amax[None, :]  each product rounded, then the sum
    lo     = max over the row of (a - t)                      NaN where any (a - t) is NaN
    out    = e where a + t >= lo, else a                      (a NaN lo rescores nothing)

every operation one float32 rounding. `row_bounds(w_q, w_scale)` gives l1 and amax, computed once per weight and
passed to every path (so their selections are the same): per row v and group g, A[v, g] = w_scale[v, g] * the sum
of |w_q[v, k]| over the group; l1[v] = the sum of A[v, :], amax[v] = the largest A[v, g].

Why the rows kept at their group32 value cannot hold the two-term maximum: group32 rounds each activation of group
g to half its scale s_g, and two terms to half s2, so in exact arithmetic |a - e| <= sum_g A[v, g] (s_g + s2) / 2,
and sum_g A[v, g] s_g <= cap l1[v] + amax[v] * (the OUTLIER_GROUPS largest s_g's excess over cap). The margin
(0.515625 over 0.5) is many times what float32 rounding adds to a, e, the scales and the bounds. So a - t <= e <=
a + t for every row v: the two-term maximum E is >= lo, every row where e = E is rescored, and every row left at a
has a < lo - t <= E. The output's largest value is E, at the first row where e is E: the two-term argmax. The
outlier groups keep the bound tight where a few channels are far larger than the rest (Gemma 3's hidden states:
the largest group scale up to 5x the second). On Gemma 3 270M's decode steps a token rescores a mean of ~10 rows of
262,144 (median 1, p99 ~120, max ~840 over 320 tokens); with one bound per row from the largest scale alone, a
token with an outlier channel rescored nearly all of them.

The other rows keep group32's error (log-probs move by a few hundredths); a sampler at a temperature sees them.

`compose(linear_group32, linear_two_terms, quantize_group32, quantize_two_terms, name)` builds the op from a family's
ops (every row computed both ways, then selected: no data-dependent shapes, so a CUDA graph captures it);
`compose_one_read(quantize_group32, quantize_two_terms, projections, name)` from one GEMM that gives both values of
every row from one read of the weights (the Triton family's). The CPU family runs it as one C call with the same
bits (salon/kernels/cpu/linear_two_terms.py), the two-term values of the rescored rows' 16-row blocks only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from salon.kernels.linear_two_terms import linear_group32_ref, linear_two_terms_ref
from salon.kernels.quantize import quantize_two_terms_ref
from salon.kernels.w8a8_group32 import quantize_group32_ref
from salon.kernels.w8a8_grouped import GROUP

# The bound's factor: 0.5 (half a rounding step) and 2^-6 more, exact in float32.
RESCORE_MARGIN = 0.515625
# The largest group scales of a row that the bound takes one by one (with each weight row's largest group sum).
OUTLIER_GROUPS = 6

# (x, w_q, w_scale, bounds, argmax=None) -> out; argmax, an int64[M] tensor where out is, gets each row's argmax of
# out (its first index on ties: torch.argmax's), which a family may find on the way (the CPU's C call: among the
# rescored rows, where the largest value is, by the bound above)
LinearRescored = Callable[..., torch.Tensor]


def row_bounds(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """f32[2, N] on w_q's device: each row's l1 and amax (the module docstring) of int8 w_q[N, K] and f32
    w_scale[N, K/32]."""
    if w_q.dtype != torch.int8 or w_q.dim() != 2 or w_q.shape[1] % GROUP:
        raise ValueError(f"row_bounds: int8 w_q[N, K] with K a multiple of {GROUP}, got {w_q.dtype} {tuple(w_q.shape)}")
    n, k = w_q.shape
    if w_scale.dtype != torch.float32 or tuple(w_scale.shape) != (n, k // GROUP):
        raise ValueError(f"row_bounds: f32 w_scale[{n}, {k // GROUP}], got {w_scale.dtype} {tuple(w_scale.shape)}")
    out = torch.empty(2, n, dtype=torch.float32, device=w_q.device)
    for start in range(0, n, 1 << 14):  # a slice at a time: the int16 copy of the whole matrix is twice its size
        rows = w_q[start : start + (1 << 14)]
        # |w| in int16 (|-128| included), a group's sum at most 32 * 128: exact in int16, and 4x faster than int32
        sums = (
            rows.to(torch.int16).abs_().view(rows.shape[0], -1, GROUP).sum(-1, dtype=torch.int16)
            * w_scale[start : start + len(rows)]
        )
        out[0, start : start + len(rows)] = sums.sum(-1)
        out[1, start : start + len(rows)] = sums.amax(-1)
    return out


def bound_factors(s32: torch.Tensor, s2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(alpha, beta) f32[M] of the group32 scales s32 f32[M, G] and the second two-term scales s2 f32[M]."""
    s = s32.sort(dim=-1, descending=True).values
    cap = s[:, OUTLIER_GROUPS] if s.shape[1] > OUTLIER_GROUPS else torch.zeros_like(s2)
    beta = s[:, 0] - cap
    for j in range(1, min(OUTLIER_GROUPS, s.shape[1])):
        beta = beta + (s[:, j] - cap)
    return (cap + s2) * RESCORE_MARGIN, beta * RESCORE_MARGIN


def select(
    a: torch.Tensor, e: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, bounds: torch.Tensor
) -> torch.Tensor:
    """The contract's selection: e where a + t >= lo, else a."""
    t = alpha[:, None] * bounds[0][None, :] + beta[:, None] * bounds[1][None, :]
    lo = (a - t).amax(dim=-1, keepdim=True)
    return torch.where(a + t >= lo, e, a)


def compose(
    linear_group32: Callable,
    linear_two_terms: Callable,
    quantize_group32: Callable,
    quantize_two_terms: Callable,
    name: str = "linear_rescored",
) -> LinearRescored:
    """The op from a family's group32 and two-term Linears and quantizations (`name`: the op's, the family's suffix)."""
    return _op(
        quantize_group32,
        quantize_two_terms,
        lambda x, q32, s32, q2, s2, w_q, w_scale: (linear_group32(x, w_q, w_scale), linear_two_terms(x, w_q, w_scale)),
        name,
    )


def compose_one_read(
    quantize_group32: Callable, quantize_two_terms: Callable, projections: Callable, name: str
) -> LinearRescored:
    """The op with both projections of every row from one read of the weights: `projections(q32, s32, q2, s2, w_q,
    w_scale) -> (a, e)` takes the quantizations' outputs (the Triton family's w8a8_group32_two_terms_triton)."""
    return _op(
        quantize_group32,
        quantize_two_terms,
        lambda x, q32, s32, q2, s2, w_q, w_scale: projections(q32, s32, q2, s2, w_q, w_scale),
        name,
    )


def _op(quantize_group32: Callable, quantize_two_terms: Callable, projections: Callable, name: str) -> LinearRescored:
    def linear_rescored(
        x: torch.Tensor,
        w_q: torch.Tensor,
        w_scale: torch.Tensor,
        bounds: torch.Tensor,
        argmax: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x f32[M, K] -> f32[M, N] (see the module docstring); bounds = row_bounds(w_q, w_scale); argmax: int64[M]
        to fill with each row's argmax of the output, or None."""
        m = x.shape[0]
        q32, s32 = quantize_group32(x)
        q2, s2 = quantize_two_terms(x)
        alpha, beta = bound_factors(s32, s2[m:])
        out = select(*projections(x, q32, s32, q2, s2, w_q, w_scale), alpha, beta, bounds)
        if argmax is not None:
            argmax.copy_(out.argmax(dim=-1))
        return out

    linear_rescored.__name__ = linear_rescored.__qualname__ = name
    return linear_rescored


linear_rescored_ref = compose(
    linear_group32_ref, linear_two_terms_ref, quantize_group32_ref, quantize_two_terms_ref, "linear_rescored_ref"
)
