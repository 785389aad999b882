"""The gated activations of the int8 FFNs, GeGLU (Gemma) and SwiGLU (Llama), as kernel ops with a fixed-order
contract: the references below, the C kernels (salon/kernels/cpu/glu.c) and the Triton kernel below run the same
float32 operations in the same order, so they give the same bits. torch's own gelu and silu pick their vector
math by the CPU they run on, which no C kernel can promise to match; a decode step that runs a whole decoder
layer in one C call needs ops that can (salon/kernels/cpu/decoder_block.h).

    geglu(y f32[M, 2F]) -> f32[M, F]:   out = gelu_tanh(g) * u,   g = y[:, :F] (gate), u = y[:, F:] (up)
    swiglu(y f32[M, 2F]) -> f32[M, F]:  out = silu(g) * u

gelu_tanh in its sigmoid form, 0.5 (1 + tanh(a)) = 1 / (1 + exp(-2a)), a = sqrt(2/pi) (g + 0.044715 g^3), and
silu as its definition:

    gelu_tanh:  g3 = (g * g) * g;   inner = g + 0.044715 * g3;   act = g / (1 + exp(inner * -2 sqrt(2/pi)))
    silu:       act = g / (1 + exp(-g))
    out = act * u

and exp in float32 (the range reduction and polynomial of salon/kernels/cpu/simd_math.h's exp, with each product
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
import triton
import triton.language as tl

from salon.kernels.triton_launch import on_device

_EXP_LO, _EXP_HI = -87.0, 88.0
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
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


@triton.jit
def _exp_contract(z):
    """The contract's exp (module docstring) in Triton: each product and sum rounded on its own (the launch
    turns FMA contraction off), round-half-even by adding and subtracting 1.5 * 2^23 (exact for |n| < 2^22),
    2^n built from its exponent bits."""
    t = tl.minimum(tl.maximum(z, -87.0), 88.0)
    n = t * 1.44269504088896341
    n = (n + 12582912.0) - 12582912.0
    r = t - n * 0.693359375
    r = r - n * -2.12194440e-4
    p = 1.9875691500e-4 * r + 1.3981999507e-3
    p = p * r + 8.3334519073e-3
    p = p * r + 4.1665795894e-2
    p = p * r + 1.6666665459e-1
    p = p * r + 5.0000001201e-1
    p = p * (r * r) + (r + 1.0)
    two_n = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(z < -87.0, 0.0, p * two_n)


@triton.jit
def _glu_kernel(y_ptr, out_ptr, F, stride_y, stride_o, GELU: tl.constexpr, BLOCK: tl.constexpr):
    # One program per (row, BLOCK columns): the gate from column c, the up projection from column F + c.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    g = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0)
    u = tl.load(y_ptr + row * stride_y + F + cols, mask=mask, other=0.0)
    if GELU:
        inner = g + 0.044715 * ((g * g) * g)
        act = tl.math.div_rn(g, 1.0 + _exp_contract(inner * -1.5957691216057308))
    else:
        act = tl.math.div_rn(g, 1.0 + _exp_contract(-g))
    tl.store(out_ptr + row * stride_o + cols, act * u, mask=mask)


_GLU_BLOCK = 1024


def _glu_triton(y: torch.Tensor, name: str, gelu: bool) -> torch.Tensor:
    _gate_and_up(y, name)
    y = y if y.stride(1) == 1 else y.contiguous()
    m, f = y.shape[0], y.shape[1] // 2
    out = torch.empty((m, f), dtype=torch.float32, device=y.device)
    if m and f:
        on_device(_glu_kernel, y.device)[(m, triton.cdiv(f, _GLU_BLOCK))](
            y, out, f, y.stride(0), out.stride(0), GELU=gelu, BLOCK=_GLU_BLOCK, num_warps=4
        )
    return out


# The Triton family's ops: one launch for the whole op, the references' operations in the references' order
# (so the contract's bits; tests/kernels check them against the references).
def geglu_triton(y: torch.Tensor) -> torch.Tensor:
    """y f32[M, 2F] -> f32[M, F]: geglu_ref's bits in one kernel."""
    return _glu_triton(y, "geglu", True)


def swiglu_triton(y: torch.Tensor) -> torch.Tensor:
    """y f32[M, 2F] -> f32[M, F]: swiglu_ref's bits in one kernel."""
    return _glu_triton(y, "swiglu", False)
