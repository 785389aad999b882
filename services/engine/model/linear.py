"""Linear layers of the two precisions behind one call: ``layer(x f32[M, K]) -> f32[M, N]``.

Int8Linear holds int8 weights symmetric per output channel; each call quantizes the activations
per token and runs the W8A8 GEMM (exact integer semantics, so every row's result is independent
of the batch it sits in). Optional gated epilogue (rows [0, N/2) gate, [N/2, N) up):
out = act(gate) * up with act = gelu_tanh (GeGLU, fused into the GEMM) or silu (SwiGLU).

activation_terms = 2 quantizes each activation row as two int8 terms, x ~ s1 * q1 + s2 * q2, where
(q2, s2) quantizes the residual x - s1 * q1 per token: about 14 bits of activation precision from the
same int8 GEMM. Both terms go through one GEMM call as rows [0, M) and [M, 2M) (the weights are read
once) and are summed per row, so a row's result still depends on that row alone.
"""

from __future__ import annotations

from typing import Callable

import torch

from services.engine.model import ops

W8A8Gemm = Callable[..., torch.Tensor]
Quantize = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
GATE_ACTIVATIONS = (None, "gelu_tanh", "silu")


def _gated(out: torch.Tensor, activation: str) -> torch.Tensor:
    n = out.shape[1] // 2
    act = ops.gelu_tanh if activation == "gelu_tanh" else torch.nn.functional.silu
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
    def __init__(self, w_q: torch.Tensor, w_scale: torch.Tensor, gemm: W8A8Gemm, gate_activation: str | None = None,
                 quantize_activations: bool = True, quantize: Quantize = ops.quantize_per_token,
                 activation_terms: int = 1) -> None:
        if w_q.dtype != torch.int8 or w_scale.shape != (w_q.shape[0],):
            raise ValueError("Int8Linear needs int8 w_q[N, K] and f32 w_scale[N]")
        if gate_activation not in GATE_ACTIVATIONS:
            raise ValueError(f"gate_activation must be one of {GATE_ACTIVATIONS}, got {gate_activation!r}")
        self.w_q = w_q.contiguous()
        self.w_scale = w_scale.to(torch.float32).contiguous()
        self.gemm = gemm
        self.quantize = quantize
        self.gate_activation = gate_activation
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
                self._w_float = self.w_q.to(torch.float32) * self.w_scale[:, None]
            return FloatLinear(self._w_float, self.gate_activation)(x)
        if self.activation_terms == 2:
            return self._two_terms(x)
        return self.from_quantized(*self.quantize(x))

    def _two_terms(self, x: torch.Tensor) -> torch.Tensor:
        q1, s1 = self.quantize(x)
        q2, s2 = self.quantize(x - q1.to(torch.float32) * s1[:, None])
        m = x.shape[0]
        both = self.gemm(torch.cat([q1, q2]), torch.cat([s1, s2]), self.w_q, self.w_scale)
        out = both[:m] + both[m:]
        return _gated(out, self.gate_activation) if self.gate_activation else out

    def from_quantized(self, a_q: torch.Tensor, a_scale: torch.Tensor) -> torch.Tensor:
        """The GEMM on activations already quantized per token (e.g. by a fused rmsnorm_quant)."""
        if self.gate_activation == "gelu_tanh":
            return self.gemm(a_q, a_scale, self.w_q, self.w_scale, geglu=True)  # GeGLU fused into the GEMM
        out = self.gemm(a_q, a_scale, self.w_q, self.w_scale)
        return _gated(out, self.gate_activation) if self.gate_activation else out

    def nbytes(self) -> int:
        return self.w_q.numel() + self.w_scale.numel() * 4


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f32[N, K] -> int8[N, K], f32[N] (symmetric per output channel)."""
    return ops.quantize_symmetric(weight, dim=1)
