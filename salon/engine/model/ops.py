"""Numeric helpers of the model that are not kernel ops (the kernel ops come from salon.kernels.backend).

Int8 conventions (salon.kernels.quantize): symmetric, scale = absmax / 127, round half to even,
clamp to [-127, 127]; integer accumulation in the GEMM.
"""

from __future__ import annotations

import torch

from salon.kernels.quantize import quantize_per_token_ref

INT8_MAX = 127.0

quantize_per_token = quantize_per_token_ref


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def quantize_symmetric(x: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and float32 scales along ``dim`` (weights per output channel, KV per token per head).

    An all-zero slice gets scale 0 and values 0.
    """
    scale = x.abs().amax(dim=dim, keepdim=True) / INT8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(x / safe), -INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale.squeeze(dim)
