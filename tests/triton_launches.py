"""Counts what a decode step launches per decoder layer on the Triton family: Triton kernel launches (every
`kernel[grid](...)` that salon.kernels.triton_launch.on_device hands out) and the torch ops run between them
(aten ops outside the kernels: slices, adds, zeros, casts, each its own launch on a GPU).

    with LayerLaunches(model) as counts:
        ...one engine step...
    counts.per_layer  -> [LayerCount, ...] one per decoder layer call of the last step, in call order

Under TRITON_INTERPRET (or on CPU tensors) the interpreter runs its kernels through numpy and copies their
arguments with torch ops of its own; those are not the engine's and are not counted (counting pauses inside a
launch).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch.utils._python_dispatch import TorchDispatchMode

from salon.kernels import triton_launch

# aten ops that make no kernel on a GPU: views and metadata only
_VIEW_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "slice",
    "select",
    "expand",
    "as_strided",
    "t",
    "transpose",
    "permute",
    "unsqueeze",
    "squeeze",
    "alias",
    "detach",
    "empty",
    "empty_like",
    "empty_strided",
    "lift_fresh",
    "split",
    "split_with_sizes",
    "unbind",
    "_reshape_alias",
    "is_same_size",
}


@dataclass
class LayerCount:
    layer_idx: int
    kernels: Counter = field(default_factory=Counter)  # Triton kernel name -> launches
    torch_ops: Counter = field(default_factory=Counter)  # aten op name -> calls (views excluded)

    @property
    def launches(self) -> int:
        """Triton launches plus torch ops: what a GPU would launch for the layer."""
        return sum(self.kernels.values()) + sum(self.torch_ops.values())


class _OpCounter(TorchDispatchMode):
    def __init__(self, owner: LayerLaunches) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        current = self.owner.current
        if current is not None and not self.owner.in_kernel:
            name = func.overloadpacket.__name__
            if name not in _VIEW_OPS:
                current.torch_ops[name] += 1
        return func(*args, **(kwargs or {}))


class LayerLaunches:
    """Context manager: records, per decoder layer call, the Triton launches and torch ops (see the module)."""

    def __init__(self, model) -> None:
        self.model = model
        self.current: LayerCount | None = None
        self.in_kernel = False
        self.calls: list[LayerCount] = []

    @property
    def per_layer(self) -> list[LayerCount]:
        """The last step's layers: the last num_layers calls."""
        return self.calls[-len(self.model.layers) :]

    def reset(self) -> None:
        self.calls = []

    def __enter__(self) -> LayerLaunches:
        owner = self
        self._saved = {}
        for cls in {type(layer) for layer in self.model.layers}:
            original = cls.__call__

            def wrapped(layer, *args, _original=original, **kwargs):
                outer = owner.current
                owner.current = LayerCount(layer.layer_idx)
                try:
                    return _original(layer, *args, **kwargs)
                finally:
                    owner.calls.append(owner.current)
                    owner.current = outer

            self._saved[cls] = original
            cls.__call__ = wrapped
        for launcher in (triton_launch._InterpretedLaunch, triton_launch._CompiledLaunch):
            original_getitem = launcher.__getitem__

            def getitem(launch_self, grid, _original=original_getitem):
                launch = _original(launch_self, grid)
                name = launch_self.kernel_name

                def counted(*args, **kwargs):
                    if owner.current is not None:
                        owner.current.kernels[name] += 1
                    saved, owner.in_kernel = owner.in_kernel, True
                    try:
                        return launch(*args, **kwargs)
                    finally:
                        owner.in_kernel = saved

                return counted

            self._saved[launcher] = original_getitem
            launcher.__getitem__ = getitem
        self._mode = _OpCounter(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for cls, original in self._saved.items():
            if cls in (triton_launch._InterpretedLaunch, triton_launch._CompiledLaunch):
                cls.__getitem__ = original
            else:
                cls.__call__ = original
