"""Linear layers of the two precisions behind one call: ``layer(x f32[M, K]) -> f32[M, N]``.

Int8Linear holds int8 weights symmetric per output channel (w_scale f32[N]) or per output channel and
group of 32 input channels (w_scale f32[N, K/32], the grouped contract of salon/kernels/w8a8_grouped.py); each
call quantizes the activations per token and runs the W8A8 GEMM (exact integer semantics, so every row's result is
independent
of the batch it sits in). Optional gated epilogue (rows [0, N/2) gate, [N/2, N) up):
out = act(gate) * up with act = gelu_tanh (GeGLU) or silu (SwiGLU). A two-term gated Linear runs the kernel
family's `geglu` or `swiglu` op (salon.kernels.glu: the activations with a fixed-order contract, the same bits in a C
kernel and in PyTorch); a one-term one takes the GEMM's fused GeGLU epilogue (torch's gelu) or torch's silu.

activation_terms = 2 quantizes each activation row as two int8 terms, x ~ s1 * q1 + s2 * q2, where
(q2, s2) quantizes the residual x - s1 * q1 per token: about 14 bits of activation precision from the
same int8 GEMM. Both terms go through one GEMM call as rows [0, M) and [M, 2M) (the weights are read
once) and are summed per row, so a row's result still depends on that row alone. The two-term path runs as
one op (salon.kernels.linear_two_terms: the kernel family's `linear_two_terms`), which also takes the RMSNorm
before the Linear and the post-norm and residual after it (`fused`), one C call on the CPU.

int16_activations = True quantizes each activation row as one int16 term instead (salon.kernels.w16a8_grouped:
about 15 bits; on CPUs without VNNI more products a second than the two int8 terms, measured by
`python -m bench.gemv --int16`), through the
family's `linear_int16` op, fused the same way. Its GEMM takes grouped scales: one scale per row is repeated
over the row's groups (the same weights, the grouped contract).

group32_activations = True quantizes each activation row as one int8 term with its own scale per 32 input channels
(salon.kernels.w8a8_group32: half the two-term recipe's int8 products), through the family's `linear_group32` op,
fused the same way (C kernels in the CPU family, Triton kernels in the Triton family).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from salon.engine.model.ops import gelu_tanh, quantize_per_token, quantize_symmetric
from salon.kernels.glu import geglu_ref, swiglu_ref
from salon.kernels.linear_rescored import LinearRescored, linear_rescored_ref, row_bounds
from salon.kernels.linear_two_terms import LinearTwoTerms, compose, linear_group32_ref, linear_int16_ref
from salon.kernels.quantize import quantize_two_terms_ref
from salon.kernels.rmsnorm import rmsnorm_ref
from salon.kernels.w8a8_grouped import GROUP

W8A8Gemm = Callable[..., torch.Tensor]
Quantize = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
GATE_ACTIVATIONS = (None, "gelu_tanh", "silu")


def _gated(out: torch.Tensor, activation: str) -> torch.Tensor:
    n = out.shape[1] // 2
    act = gelu_tanh if activation == "gelu_tanh" else torch.nn.functional.silu
    return act(out[:, :n]) * out[:, n:]


class FloatLinear:
    def __init__(self, weight: torch.Tensor, gate_activation: str | None = None) -> None:
        if gate_activation not in GATE_ACTIVATIONS:
            raise ValueError(f"gate_activation must be one of {GATE_ACTIVATIONS}, got {gate_activation!r}")
        self.weight = weight.contiguous()
        self.gate_activation = gate_activation
        self.out_features = weight.shape[0] // 2 if gate_activation else weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.weight.T
        return _gated(out, self.gate_activation) if self.gate_activation else out

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class Int8Linear:
    def __init__(
        self,
        w_q: torch.Tensor,
        w_scale: torch.Tensor,
        gemm: W8A8Gemm,
        gate_activation: str | None = None,
        quantize_activations: bool = True,
        quantize: Quantize = quantize_per_token,
        activation_terms: int = 1,
        quantize_two_terms: Quantize = quantize_two_terms_ref,
        linear_two_terms: LinearTwoTerms | None = None,
        geglu: Callable[[torch.Tensor], torch.Tensor] = geglu_ref,
        swiglu: Callable[[torch.Tensor], torch.Tensor] = swiglu_ref,
        int16_activations: bool = False,
        linear_int16: LinearTwoTerms = linear_int16_ref,
        group32_activations: bool = False,
        linear_group32: LinearTwoTerms = linear_group32_ref,
        rescored: bool = False,
        linear_rescored: LinearRescored = linear_rescored_ref,
    ) -> None:
        grouped = (w_q.shape[0], w_q.shape[1] // GROUP) if w_q.dim() == 2 and w_q.shape[1] % GROUP == 0 else None
        if w_q.dtype != torch.int8 or w_q.dim() != 2 or tuple(w_scale.shape) not in ((w_q.shape[0],), grouped):
            raise ValueError(
                f"Int8Linear needs int8 w_q[N, K] and f32 w_scale[N] or [N, K/{GROUP}], got "
                f"{w_q.dtype} {tuple(w_q.shape)} and {tuple(w_scale.shape)}"
            )
        if gate_activation not in GATE_ACTIVATIONS:
            raise ValueError(f"gate_activation must be one of {GATE_ACTIVATIONS}, got {gate_activation!r}")
        for recipe, chosen in (("int16", int16_activations), ("group32", group32_activations)):
            if chosen and (activation_terms != 1 or w_q.shape[1] % GROUP):
                raise ValueError(
                    f"{recipe} activations: one term and K a multiple of {GROUP}, got {activation_terms} "
                    f"terms and K={w_q.shape[1]}"
                )
        if int16_activations and group32_activations:
            raise ValueError("int16 and group32 activations are two recipes: choose one")
        if rescored and (grouped is None or tuple(w_scale.shape) != grouped or gate_activation or int16_activations):
            raise ValueError(
                "a rescored Linear (salon.kernels.linear_rescored) takes grouped weights, no gate and int8 activations"
            )
        self.w_q = w_q.contiguous()
        self.w_scale = w_scale.to(torch.float32).contiguous()
        if int16_activations and self.w_scale.dim() == 1:
            self.w_scale = self.w_scale[:, None].expand(-1, w_q.shape[1] // GROUP).contiguous()
        self.gemm = gemm
        self.quantize = quantize
        self.quantize_two_terms = quantize_two_terms
        # The two-term op (norm, both terms, GEMM, sum, post-norm, residual); by default composed of the given ops.
        self.linear_two_terms = linear_two_terms or compose(rmsnorm_ref, quantize_two_terms, gemm)
        self.int16_activations = int16_activations
        self.linear_int16 = linear_int16
        self.group32_activations = group32_activations
        self.linear_group32 = linear_group32
        # group32 with the rows that could be the largest under two terms rescored with them (the output projection)
        self.rescored = rescored
        self.linear_rescored = linear_rescored
        self.bounds = row_bounds(self.w_q, self.w_scale) if rescored else None
        self.gate_activation = gate_activation
        # the two-term path's gated activation (salon.kernels.glu)
        self.glu = {"gelu_tanh": geglu, "silu": swiglu}.get(gate_activation)
        if activation_terms not in (1, 2):
            raise ValueError(f"activation_terms must be 1 or 2, got {activation_terms}")
        self.activation_terms = activation_terms
        # False: weight-only int8 (activations stay float) -- used to measure each part's cost.
        self.quantize_activations = quantize_activations
        self.out_features = w_q.shape[0] // 2 if gate_activation else w_q.shape[0]
        self._w_float: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.quantize_activations:
            if self._w_float is None:
                self._w_float = dequantize_weight(self.w_q, self.w_scale)
            return FloatLinear(self._w_float, self.gate_activation)(x)
        if self.fuses():
            return self.fused(x)
        return self.from_quantized(*self.quantize(x))

    def fused(
        self,
        x: torch.Tensor,
        norm_weight: torch.Tensor | None = None,
        eps: float = 0.0,
        post_norm: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The fused Linear (two int8 terms, one int16 term, or group32's one int8 term) of rmsnorm(x,
        norm_weight) (x itself without one), then residual + rmsnorm(out, post_norm) where given; a gated Linear
        takes no post-norm or residual."""
        if self.gate_activation and (post_norm is not None or residual is not None):
            raise ValueError("a gated Linear's output takes no post-norm or residual here")
        if self.rescored:
            if norm_weight is not None or post_norm is not None or residual is not None:
                raise ValueError("a rescored Linear takes no norm, post-norm or residual")
            return self.linear_rescored(x, self.w_q, self.w_scale, self.bounds)
        if self.int16_activations:
            op = self.linear_int16
        elif self.group32_activations:
            op = self.linear_group32
        else:
            op = self.linear_two_terms
        out = op(x, self.w_q, self.w_scale, norm_weight, eps, post_norm, residual)
        return self.glu(out) if self.glu is not None else out

    def with_argmax(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(self(x), each row's argmax of it (first index on ties) where the op finds it on the way, int64[M] where x
        is; else None): the rescored output projection's C call takes it from the few rows it rescored, so a greedy
        step need not read the logits again."""
        if not (self.rescored and self.quantize_activations):
            return self(x), None
        argmax = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
        return self.linear_rescored(x, self.w_q, self.w_scale, self.bounds, argmax), argmax

    def fuses(self) -> bool:
        """Whether this Linear runs as one fused op: quantized activations as two int8 terms, one int16 term or one
        int8 term per 32 channels."""
        return self.quantize_activations and (
            self.activation_terms == 2 or self.int16_activations or self.group32_activations or self.rescored
        )

    def from_quantized(self, a_q: torch.Tensor, a_scale: torch.Tensor) -> torch.Tensor:
        """The GEMM on activations already quantized per token (e.g. by a fused rmsnorm_quant)."""
        if self.gate_activation == "gelu_tanh":
            return self.gemm(a_q, a_scale, self.w_q, self.w_scale, geglu=True)  # GeGLU fused into the GEMM
        out = self.gemm(a_q, a_scale, self.w_q, self.w_scale)
        return _gated(out, self.gate_activation) if self.gate_activation else out

    def nbytes(self) -> int:
        return self.w_q.numel() + self.w_scale.numel() * 4 + (0 if self.bounds is None else self.bounds.numel() * 4)


def quantize_weight(weight: torch.Tensor, group: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """f32[N, K] -> int8[N, K], f32[N] (symmetric per output channel), or with group = GROUP f32[N, K/GROUP]
    (symmetric per output channel and group of input channels; K a multiple of the group)."""
    if not group:
        return quantize_symmetric(weight, dim=1)
    n, k = weight.shape
    if group != GROUP or k % group:
        raise ValueError(f"weight groups: {GROUP} input channels of a K divisible by {GROUP}, got {group} for K={k}")
    q, scale = quantize_symmetric(weight.reshape(n, k // group, group), dim=2)
    return q.reshape(n, k).contiguous(), scale.contiguous()


def dequantize_weight(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """int8[N, K] with f32[N] or f32[N, K/GROUP] scales -> f32[N, K]."""
    if w_scale.dim() == 1:
        return w_q.to(torch.float32) * w_scale[:, None]
    n, k = w_q.shape
    return (w_q.reshape(n, -1, GROUP).to(torch.float32) * w_scale[:, :, None]).reshape(n, k)
