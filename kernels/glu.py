"""The gated activations of the int8 FFNs, GeGLU (Gemma) and SwiGLU (Llama), as kernel ops with a fixed-order
contract: the references below and the C kernels (kernels/cpu/glu.c) run the same float32 operations in the
same order, so they give the same bits. torch's own gelu and silu pick their vector math by the CPU they run
on, which no C kernel can promise to match; a decode step that runs a whole decoder layer in one C call needs
ops that can (kernels/cpu/decoder_block.h).

    geglu(y f32[M, 2F]) -> f32[M, F]:   out = gelu_tanh(g) * u,   g = y[:, :F] (gate), u = y[:, F:] (up)
    swiglu(y f32[M, 2F]) -> f32[M, F]:  out = silu(g) * u

gelu_tanh in its sigmoid form, 0.5 (1 + tanh(a)) = 1 / (1 + exp(-2a)), a = sqrt(2/pi) (g + 0.044715 g^3), and
silu as its definition:

    gelu_tanh:  g3 = (g * g) * g;   inner = g + 0.044715 * g3;   act = g / (1 + exp(inner * -2 sqrt(2/pi)))
    silu:       act = g / (1 + exp(-g))
    out = act * u

and exp in float32 (the range reduction and polynomial of kernels/cpu/simd_math.h's exp, with each product
and sum rounded on its own, no fused multiply-add):

    zero where z < -87;   t = min(max(z, -87), 88)
    n = round_half_even(t * log2(e));   r = (t - n * 0.693359375) - n * -2.12194440e-4
    p = Horner(r; 1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
               5.0000001201e-1);   p = p * (r * r) + (r + 1)
    exp = p * 2^n   (n in [-126, 127]: 2^n is exact, and so is the product, which stays a normal float)

Every operation is rounded to float32 (torch's elementwise ops and the C kernel's are IEEE), so the bits are
the same on every CPU. For g >= -2 gelu_tanh is within 4 float32 ulps of its float64 value and silu within 4
too (for g >= -10); below, where the activation is a tail, the relative error grows with the exp argument's
own rounding (about 100 ulps for gelu_tanh at g = -9, where its value is 1e-29), while torch's tanh form of
gelu loses every digit there (a test checks both).
"""

from __future__ import annotations

import torch

_EXP_LO, _EXP_HI = -87.0, 88.0
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
             5.0000001201e-1)
_KAPPA = 0.044715
_MINUS_2_SQRT_2_OVER_PI = -1.5957691216057308


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    """The constant rounded to float32 (as the C kernel's float literal is), on like's device."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def exp_ref(z: torch.Tensor) -> torch.Tensor:
    """f32 -> f32: the contract's exp (module docstring), every operation rounded to float32."""
    t = torch.clamp(z, _EXP_LO, _EXP_HI)
    n = torch.round(t * _f32(_LOG2E, z))
    r = t - n * _f32(_LN2_HI, z)
    r = r - n * _f32(_LN2_LO, z)
    p = _f32(_EXP_POLY[0], z).expand_as(r)
    for c in _EXP_POLY[1:]:
        p = p * r + _f32(c, z)
    p = p * (r * r) + (r + _f32(1.0, z))
    two_n = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return torch.where(z < _f32(_EXP_LO, z), _f32(0.0, z), p * two_n)


def gelu_tanh_ref(g: torch.Tensor) -> torch.Tensor:
    """f32 -> f32: the contract's gelu_tanh (module docstring)."""
    g3 = (g * g) * g
    inner = g + _f32(_KAPPA, g) * g3
    return g / (_f32(1.0, g) + exp_ref(inner * _f32(_MINUS_2_SQRT_2_OVER_PI, g)))


def silu_ref(g: torch.Tensor) -> torch.Tensor:
    """f32 -> f32: the contract's silu (module docstring)."""
    return g / (_f32(1.0, g) + exp_ref(-g))


def _gate_and_up(y: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if y.dim() != 2 or y.shape[1] % 2 or y.dtype != torch.float32:
        raise ValueError(f"{name}: expected float32 [M, 2F], got {y.dtype} {tuple(y.shape)}")
    f = y.shape[1] // 2
    return y[:, :f], y[:, f:]


def geglu_ref(y: torch.Tensor) -> torch.Tensor:
    """y f32[M, 2F] (gate columns first, then up) -> f32[M, F], the contract's bits."""
    g, u = _gate_and_up(y, "geglu")
    return gelu_tanh_ref(g) * u


def swiglu_ref(y: torch.Tensor) -> torch.Tensor:
    """y f32[M, 2F] (gate columns first, then up) -> f32[M, F], the contract's bits."""
    g, u = _gate_and_up(y, "swiglu")
    return silu_ref(g) * u


# The Triton family's ops: the references' elementwise ops on the tensor's device (IEEE there too, so the
# contract's bits); Triton kernels of their own would save passes over [M, 2F], a small part of a GPU step.
def geglu_triton(y: torch.Tensor) -> torch.Tensor:
    return geglu_ref(y)


def swiglu_triton(y: torch.Tensor) -> torch.Tensor:
    return swiglu_ref(y)
