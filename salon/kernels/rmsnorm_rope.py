"""RMSNorm per head, then NeoX RoPE, as one op: Gemma 3's q-norm and k-norm before the rotation.

    rmsnorm_rope(x f32[T, H, D], weight f32[D], eps, positions int64[T], base)
        = rope_neox(rmsnorm(x, weight, eps), positions, base)

`compose(rmsnorm, rope_neox)` builds it from a family's two ops (the reference, the Triton family, the CPU
family's fallback); salon/kernels/cpu/rmsnorm_rope.py runs both in one C call with the bits of the CPU family's two.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from salon.kernels.rmsnorm import rmsnorm_ref
from salon.kernels.rope import rope_neox_ref


def compose(rmsnorm: Callable, rope_neox: Callable, name: str = "rmsnorm_rope") -> Callable:
    def rmsnorm_rope(
        x: torch.Tensor, weight: torch.Tensor, eps: float, positions: torch.Tensor, base: float
    ) -> torch.Tensor:
        """x f32[T, H, D] -> f32[T, H, D] (see the module docstring)."""
        return rope_neox(rmsnorm(x, weight, eps), positions, base)

    rmsnorm_rope.__name__ = rmsnorm_rope.__qualname__ = name
    return rmsnorm_rope


rmsnorm_rope_ref = compose(rmsnorm_ref, rope_neox_ref, "rmsnorm_rope_ref")
