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
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_redirect_lock = threading.RLock()


@functools.cache
def _interpreted(fn) -> InterpretedFunction:
    return InterpretedFunction(fn)


def _call_interpreted(self: JITFunction, *args, **kwargs):
    return _interpreted(self.fn)(*args, **kwargs)


class _Launcher:
    """`kernel[grid](...)` for one kernel on one kind of device, built once per (kernel, device type) by
    on_device: `[grid]` hands out one launch function per grid, kept, which calls the kernel's `run` directly
    (Triton's own `kernel[grid]` builds a fresh lambda each time; a decode step launches the same kernels on
    the same grids every step). Triton keys its compiled variants by the constexpr arguments itself."""

    def __init__(self, kernel, name: str) -> None:
        self._kernel = kernel
        self.kernel_name = name
        self._launches: dict = {}

    def __getitem__(self, grid):
        launch = self._launches.get(grid)
        if launch is None:
            launch = self._launches[grid] = self._bind(grid)
        return launch


class _InterpretedLaunch(_Launcher):
    """`kernel[grid](...)` through the interpreter, with nested jit helpers interpreted too."""

    def _bind(self, grid):
        run = self._kernel.run

        def launch(*args, **kwargs):
            with _redirect_lock:
                saved = JITFunction.__call__
                lang = _lang_attributes()
                JITFunction.__call__ = _call_interpreted
                try:
                    return run(*args, grid=grid, warmup=False, **kwargs)
                finally:
                    JITFunction.__call__ = saved
                    _restore_lang(lang)

        return launch


# What the interpreter patches while it runs a kernel. Triton's own restore misses some of it (triton 3.9 left 64 of
# triton.language.core's builtins and tensor.__repr__ as the interpreter's): a kernel compiled later in the same
# process then fails (the sm_90 PTX tests after the interpreter's, on a cold Triton cache).
_LANG_OBJECTS = (tl, tl.core, tl.math, tl.tensor)
_ABSENT = object()


def _lang_attributes() -> list[tuple[object, dict]]:
    return [(obj, dict(vars(obj))) for obj in _LANG_OBJECTS]


def _restore_lang(saved: list[tuple[object, dict]]) -> None:
    """Every attribute of _LANG_OBJECTS as it was before the launch: changed ones set back, added ones removed."""
    for obj, attrs in saved:
        now = vars(obj)
        for name in [n for n in now if n not in attrs]:
            delattr(obj, name)
        for name, value in attrs.items():
            if now.get(name, _ABSENT) is not value:
                setattr(obj, name, value)


class _CompiledLaunch(_Launcher):
    """`kernel[grid](...)` compiled without floating-point contraction (enable_fp_fusion=False) unless the call
    says otherwise: Triton fuses a product and a sum into one FMA by default on GPUs, which the references (and
    the interpreter, and the CPU kernels) round twice, so the bits would differ."""

    def _bind(self, grid):
        run = self._kernel.run

        def launch(*args, **kwargs):
            kwargs.setdefault("enable_fp_fusion", False)
            return run(*args, grid=grid, warmup=False, **kwargs)

        return launch


@functools.cache
def _launcher(kernel, device_type: str) -> _Launcher:
    name = kernel.fn.__name__
    if device_type == "cuda":
        return _CompiledLaunch(kernel, name)
    return _InterpretedLaunch(_interpreted(kernel.fn), name)


def on_device(kernel, device: torch.device):
    """The runnable form of `kernel` for tensors on `device` (compiled on CUDA without FMA contraction,
    interpreted on CPU), one per kernel and device type."""
    if isinstance(kernel, InterpretedFunction):
        return kernel
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"Triton kernels run on cuda (or cpu through the interpreter), not on {device}")
    return _launcher(kernel, device.type)


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
