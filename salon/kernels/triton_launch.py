"""Launch helpers shared by the Triton kernels in salon/kernels/.

A `@triton.jit` kernel compiles for the GPU. The same kernel body also runs on CPU tensors in Triton's
interpreter (numpy underneath), which is how the kernels are tested on machines without a GPU. Whether
`triton.jit` builds a compiled or an interpreted function is decided once, at decoration time, from
TRITON_INTERPRET; so instead of depending on import order, `on_device(kernel, device)` picks the compiled
kernel for CUDA tensors and an interpreted copy of the same Python function for CPU tensors.

Kernels call `@triton.jit` helpers of triton.language (tl.max, tl.sum, ...) which were built as compiled
functions; while an interpreted launch runs, `JITFunction.__call__` is redirected to interpret the helper's
Python body. That redirect is process-wide for the duration of the launch, which is fine because interpreted
launches only happen in tests and CPU checks, never on the engine's serving path (CPU serving uses the torch
references and salon/kernels/cpu/).
"""

from __future__ import annotations

import functools
import threading

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_redirect_lock = threading.RLock()


@functools.cache
def _interpreted(fn) -> InterpretedFunction:
    return InterpretedFunction(fn)


def _call_interpreted(self: JITFunction, *args, **kwargs):
    return _interpreted(self.fn)(*args, **kwargs)


class _InterpretedLaunch:
    """`kernel[grid](...)` through the interpreter, with nested jit helpers interpreted too."""

    def __init__(self, fn) -> None:
        self._kernel = _interpreted(fn)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            with _redirect_lock:
                saved = JITFunction.__call__
                JITFunction.__call__ = _call_interpreted
                try:
                    return self._kernel[grid](*args, **kwargs)
                finally:
                    JITFunction.__call__ = saved

        return launch


class _CompiledLaunch:
    """`kernel[grid](...)` compiled without floating-point contraction (enable_fp_fusion=False) unless the call
    says otherwise: Triton fuses a product and a sum into one FMA by default on GPUs, which the references (and
    the interpreter, and the CPU kernels) round twice, so the bits would differ."""

    def __init__(self, kernel) -> None:
        self._kernel = kernel

    def __getitem__(self, grid):
        launch = self._kernel[grid]
        return lambda *args, **kwargs: launch(*args, **{"enable_fp_fusion": False, **kwargs})


def on_device(kernel, device: torch.device):
    """The runnable form of `kernel` for tensors on `device` (compiled on CUDA without FMA contraction,
    interpreted on CPU)."""
    if isinstance(kernel, InterpretedFunction):
        return kernel
    if device.type == "cuda":
        return _CompiledLaunch(kernel)
    if device.type == "cpu":
        return _InterpretedLaunch(kernel.fn)
    raise ValueError(f"Triton kernels run on cuda (or cpu through the interpreter), not on {device}")


def is_interpreted(device: torch.device) -> bool:
    """True where kernels run in the interpreter: there, `tl.dot` is done on float32 operands."""
    return device.type != "cuda"


def check(condition: bool, message: str) -> None:
    """Launcher argument check: raises ValueError naming the offending argument."""
    if not condition:
        raise ValueError(message)


def check_tensor(name: str, t: torch.Tensor, dtype: torch.dtype, ndim: int, device: torch.device) -> None:
    check(isinstance(t, torch.Tensor), f"{name}: expected a tensor, got {type(t).__name__}")
    check(t.dtype == dtype, f"{name}: expected dtype {dtype}, got {t.dtype}")
    check(t.dim() == ndim, f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    check(t.device == device, f"{name}: expected device {device}, got {t.device}")


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))
