"""Linear layers of the two precisions behind one call: ``layer(x f32[M, K]) -> f32[M, N]``.

Int8Linear holds int8 weights symmetric per output channel; each call quantizes the activations
per token and runs the W8A8 GEMM (exact integer semantics, so every row's result is independent
of the batch it sits in). Optional fused epilogues: GeGLU (rows [0, N/2) gate, [N/2, N) up).
"""

from __future__ import annotations

from typing import Callable

import torch

from services.engine.model import ops

W8A8Gemm = Callable[..., torch.Tensor]
Quantize = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class FloatLinear:
    def __init__(self, weight: torch.Tensor, geglu: bool = False) -> None:
        self.weight = weight.contiguous()
        self.geglu = geglu
        self.out_features = weight.shape[0] // 2 if geglu else weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.weight.T
        if self.geglu:
            n = out.shape[1] // 2
            out = ops.gelu_tanh(out[:, :n]) * out[:, n:]
        return out

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class Int8Linear:
    def __init__(self, w_q: torch.Tensor, w_scale: torch.Tensor, gemm: W8A8Gemm, geglu: bool = False,
                 quantize_activations: bool = True, quantize: Quantize = ops.quantize_per_token) -> None:
        if w_q.dtype != torch.int8 or w_scale.shape != (w_q.shape[0],):
            raise ValueError("Int8Linear needs int8 w_q[N, K] and f32 w_scale[N]")
        self.w_q = w_q.contiguous()
        self.w_scale = w_scale.to(torch.float32).contiguous()
        self.gemm = gemm
        self.quantize = quantize
        self.geglu = geglu
        # False: weight-only int8 (activations stay float) -- used to measure each part's cost.
        self.quantize_activations = quantize_activations
        self.out_features = w_q.shape[0] // 2 if geglu else w_q.shape[0]
        self._w_float: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.quantize_activations:
            if self._w_float is None:
                self._w_float = self.w_q.to(torch.float32) * self.w_scale[:, None]
            return FloatLinear(self._w_float, self.geglu)(x)
        return self.from_quantized(*self.quantize(x))

    def from_quantized(self, a_q: torch.Tensor, a_scale: torch.Tensor) -> torch.Tensor:
        """The GEMM on activations already quantized per token (e.g. by a fused rmsnorm_quant)."""
        return self.gemm(a_q, a_scale, self.w_q, self.w_scale, geglu=self.geglu)

    def nbytes(self) -> int:
        return self.w_q.numel() + self.w_scale.numel() * 4


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f32[N, K] -> int8[N, K], f32[N] (symmetric per output channel)."""
    return ops.quantize_symmetric(weight, dim=1)
